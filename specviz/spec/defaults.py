"""RunSpec's defaults as the page and the command line offer them: read from RunSpec's fields,
never restated."""
from __future__ import annotations

from specviz.spec.run import PAIR_PRESETS, RunSpec


def default_of(field: str):
    """RunSpec's default for `field`."""
    return RunSpec.model_fields[field].default


# The preset that names RunSpec's default target and draft: a run's pair unless told otherwise.
DEFAULT_PAIR = next(name for name, ids in PAIR_PRESETS.items()
                    if ids == (default_of("target"), default_of("draft")))
