"""The package's version, in a leaf module every layer may import (the CLI, fetch's User-Agent, Dask checks)."""

__version__ = "0.1.0"


__all__ = []
