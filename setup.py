"""Builds the C engine and its Cython binding into warp_providers._engine.

The engine sources compile with plain flags: SIMD kernels select their instruction sets
with per-file target pragmas and are chosen at run time, so the wheel runs on any
x86-64 CPU (never -march=native).
"""

import glob

from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

ENGINE_SOURCES = sorted(glob.glob("engine/src/**/*.c", recursive=True))

engine = Extension(
    "warp_providers._engine",
    sources=["warp_providers/_engine.pyx", *ENGINE_SOURCES],
    include_dirs=["engine/include", "engine/src"],
    extra_compile_args=["-std=c11", "-O2", "-D_GNU_SOURCE", "-pthread", "-Wno-unused-parameter"],
    extra_link_args=["-pthread"],
    libraries=["m"],
)

setup(
    # The adapters are distributions of their own (integrations/*/pyproject.toml).
    packages=find_packages(include=["warp_providers", "warp_providers.*"]),
    package_data={"warp_providers": ["py.typed", "*.pyi", "*.pxd"]},
    ext_modules=cythonize([engine], language_level=3, compiler_directives={"binding": False}),
)
