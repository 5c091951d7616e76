"""Draft/target pairs: presets, Hub ids and local paths, the embedded default and its derived draft,
the tiny random pair. May import: spec."""
