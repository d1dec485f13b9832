"""Hash-field encoding of a series: unambiguous for any label value, cheap to decode.

A field is a list of components joined by ``|``: the metric name, the label values in declared
order, then, for a histogram, its bucket layout (``h:<8 hex>``). In each component ``\\`` is
written ``\\\\``, ``|`` is written ``\\/`` and a newline ``\\n``, so a ``|`` in a field is always a
separator and a field is always one line (a writer's chunk lists its series one per line, see
docs/key-schema.md). Label values with none of these (nearly all) are stored as they are, and
decoding them is one ``str.split``.
"""

from __future__ import annotations

import hashlib
import re

SEP = "|"
_UNESCAPE_RE = re.compile(r"\\(.)")
_UNESCAPES = {"\\": "\\", "/": "|", "n": "\n"}


def _escape(component: str) -> str:
    if "\\" in component or SEP in component or "\n" in component:
        return component.replace("\\", "\\\\").replace(SEP, "\\/").replace("\n", "\\n")
    return component


def _unescape(component: str) -> str:
    def sub(match: re.Match[str]) -> str:
        char = match.group(1)
        if char not in _UNESCAPES:
            raise ValueError(f"bad escape \\{char} in field component {component!r}")
        return _UNESCAPES[char]

    return _UNESCAPE_RE.sub(sub, component)


def encode(components: tuple[str, ...] | list[str]) -> str:
    """Join *components* into one field."""
    return SEP.join([_escape(c) for c in components])


def decode(field: str) -> list[str]:
    """Split *field* back into its components (raises ValueError on a malformed escape)."""
    parts = field.split(SEP)
    if "\\" in field:
        parts = [_unescape(p) for p in parts]
    return parts


def bound_text(bound: float) -> str:
    """A bucket bound as Prometheus writes ``le`` (``0.005``, ``1e+06``, ``+Inf``)."""
    from prometheus_client.utils import floatToGoString

    return str(floatToGoString(bound))


def bucket_tag(bounds: tuple[float, ...] | list[float]) -> str:
    """``h:<8 hex>``: names a histogram's bucket bounds. It ends the field of a histogram series,
    so a reader never applies counts to the wrong bounds when a bucket list changes."""
    text = ",".join(bound_text(b) for b in bounds)
    return "h:" + hashlib.sha1(text.encode()).hexdigest()[:8]


# -- a writer's chunks (schema 2, see docs/key-schema.md) ------------------------------------------
#
# A writer keeps its absolute state of one engine in chunks of that engine's hash: the field
# ``@|<writer>|<k>`` holds the values of up to CHUNK_SIZE series, one per line, and the field
# ``@|<writer>|<k>|n`` their series fields, one per line in the same order. A series field starts
# with a metric name, never with "@", so a chunk field cannot be taken for a series.

CHUNK_PREFIX = "@" + SEP
NAMES_SUFFIX = SEP + "n"
CHUNK_SIZE = 64


def chunk_field(writer: str, index: int) -> str:
    """The field of chunk *index* of *writer* (its values); its names are this + ``|n``."""
    return encode(("@", writer, str(index)))


def chunk_writer(field: str) -> str | None:
    """The writer of a chunk's values field ``@|<writer>|<k>``, or None if it is not one."""
    if "\\" not in field:  # no escape (every writer id but one holding |, \\ or a newline): no decode
        head, sep, index = field.rpartition(SEP)
        writer = head[2:]
        plain = sep and head.startswith(CHUNK_PREFIX) and SEP not in writer
        if plain and index.isdigit() and index.isascii():
            return writer
    try:
        parts = decode(field)
    except ValueError:
        return None
    # the index: ASCII digits only (isdigit alone takes "²")
    if len(parts) != 3 or parts[0] != "@" or not (parts[2].isdigit() and parts[2].isascii()):
        return None
    return parts[1]
