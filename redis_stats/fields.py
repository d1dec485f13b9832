"""Hash-field encoding of a series: unambiguous for any label value, cheap to decode.

A field is a list of components joined by ``|``: the metric name, the label values in declared
order, then one suffix by kind (histogram: the bucket bound or ``sum``; gauge: the writer id).
In each component ``\\`` is written ``\\\\`` and ``|`` is written ``\\/``, so a ``|`` in a field is
always a separator. Label values that contain neither (nearly all) are stored as they are, and
decoding them is one ``str.split``.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["SEP", "decode", "encode"]

SEP = "|"
_UNESCAPE_RE = re.compile(r"\\(.)")
_UNESCAPES = {"\\": "\\", "/": "|"}


def _escape(component: str) -> str:
    if "\\" in component or SEP in component:
        return component.replace("\\", "\\\\").replace(SEP, "\\/")
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


def bucket_layout(bounds: tuple[float, ...] | list[float]) -> str:
    """``h:<8 hex>``: names a histogram's bucket bounds. It ends the field of a histogram series,
    so a reader never applies counts to the wrong bounds when a bucket list changes."""
    text = ",".join(bound_text(b) for b in bounds)
    return "h:" + hashlib.sha1(text.encode()).hexdigest()[:8]
