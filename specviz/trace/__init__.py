"""The trace, the one contract between the engine and everything after it: its schema and
migrations, and what is read off a trace (metrics, frames, text, sweep reports, share links). May
import: spec. No torch."""
