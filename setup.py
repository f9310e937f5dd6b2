"""Builds DKV's optional C module; everything else is declared in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and DKV runs its
pure-Python reference code (``storage.dkv.native.NATIVE`` is then None).
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "storage.dkv._native",
            ["storage/dkv/_native.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Werror"],
            optional=True,
        )
    ]
)
