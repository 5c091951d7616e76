"""The tail every benchmark shares: its Markdown printed and, with --out, written."""
from pathlib import Path


def publish(text: str, out: Path | None) -> None:
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
