"""Generate docs/reference/views.md from the SQL modules' comment blocks.

Usage: python -m nestrace.query.viewdocs [--check]
"""
import sys

from nestrace._paths import SQL_DIR
from nestrace.query.sqlmod import discover, reference_markdown


def main() -> int:
    root = SQL_DIR.parent.parent
    target = root / "docs" / "reference" / "views.md"
    text = reference_markdown(discover())
    if "--check" in sys.argv:
        if not target.exists() or target.read_text() != text:
            print(f"{target}: drifted from correlate/sql; run python -m nestrace.query.viewdocs",
                  file=sys.stderr)
            return 1
        print("check-generated: docs/reference/views.md matches correlate/sql")
        return 0
    target.write_text(text)
    print(f"wrote {target.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
