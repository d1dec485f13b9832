"""The nemesis run (issue 48): a seeded, bounded run of a whole deployment on loopback with faults
several at once, and a checker over the recorded history. ``make nemesis`` (``SEED=``,
``DURATION=``) runs :mod:`tests.nemesis.run`; docs/reliability.md says what it checks."""
