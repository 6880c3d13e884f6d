"""Build of the compiled ingest hot path (ingest/csrc/rw_native.c -> ingest._rw_native).

Everything else about the package is in pyproject.toml. The extension is optional at run time:
when it is missing (or failed to build) ingest/series_refs.py selects the pure-Python walk.
Build it in place with ``python setup.py build_ext --inplace`` (the Makefile does this).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("ingest._rw_native", ["ingest/csrc/rw_native.c"],
                             extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-field-initializers"],
                             extra_link_args=["-pthread"], optional=True)])
