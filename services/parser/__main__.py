"""`python -m services.parser` / `binlake parser`."""

from services.parser import app
from services.parser.config import ParserConfig
from shared.runner import run_service


def main() -> None:
    run_service("parser", ParserConfig.from_env, app.main, rows_gc=True)


if __name__ == "__main__":
    main()
