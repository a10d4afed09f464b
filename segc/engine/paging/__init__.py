"""Paging: models larger than memory, their weights paged in band by band under a
memory budget, fenced by events, and their KV caches paged to host memory when they do
not fit (docs/paging.md)."""

from .kvstore import KVStore as KVStore
from .model import PagedModel as PagedModel
from .model import PagingStats as PagingStats
from .pager import Pager as Pager
from .source import DiskSource as DiskSource
from .source import HostSource as HostSource
from .source import TensorInfo as TensorInfo
from .store import save_model_dir as save_model_dir

__all__ = ["DiskSource", "HostSource", "KVStore", "PagedModel", "Pager", "PagingStats", "TensorInfo", "save_model_dir"]
