"""`python -m services.store` / `binlake store`."""

from services.store import app
from services.store.config import StoreConfig
from shared.runner import run_service


def main() -> None:
    run_service("store", StoreConfig.from_env, app.main)


if __name__ == "__main__":
    main()
