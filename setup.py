"""Build of the compiled parts: the ingest hot path (ingest/csrc/rw_native.c -> ingest._rw_native),
the HTTP API's matrix JSON assembly (turboprom/csrc/json_native.c -> turboprom._json_native) and the
head's merge of sorted runs (storage/csrc/merge_native.c -> storage._merge_native).

Everything else about the package is in pyproject.toml. The extensions are optional at run time:
when one is missing (or failed to build) ingest/series_refs.py selects the pure-Python walk,
turboprom/api_json.py the pure-Python assembly and storage/columns.py the numpy merge.
Build it in place with ``python setup.py build_ext --inplace`` (the Makefile does this).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("ingest._rw_native", ["ingest/csrc/rw_native.c"],
                             extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-field-initializers"],
                             extra_link_args=["-pthread"], optional=True),
                   Extension("turboprom._json_native", ["turboprom/csrc/json_native.c"],
                             extra_compile_args=["-O2", "-std=c11", "-Wall"], optional=True),
                   Extension("storage._merge_native", ["storage/csrc/merge_native.c"],
                             extra_compile_args=["-O2", "-std=c11", "-Wall"], optional=True)])
