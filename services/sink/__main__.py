"""`python -m services.sink` / `binlake sink`."""

from services.sink import app
from services.sink.config import SinkConfig
from shared.runner import run_service


def main() -> None:
    run_service("sink", SinkConfig.from_env, app.main, rows_gc=True)


if __name__ == "__main__":
    main()
