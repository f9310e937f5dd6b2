"""Packaging beyond pyproject.toml: the ``dkvstream`` namespace and DKV's optional C module.

The repository keeps its top-level folders (``operators/``, ``storage/``, ``assets/``,
``examples/``) and installs them under one package, ``dkvstream`` (``dkvstream.operators``,
``dkvstream.storage``, ...), so an installed dkvstream never collides with a user
project's own ``assets`` or ``storage`` package. ``PACKAGE_DIRS`` maps each installed
package to its folder; every sub-package below a folder is found and installed under it.

``optional=True``: without a C compiler the install still succeeds and DKV runs its
pure-Python reference code (``dkvstream.storage.dkv.native.NATIVE`` is then None). An
editable install builds the module in place, into ``storage/dkv/``.
"""
from setuptools import Extension, find_packages, setup

PACKAGE_DIRS = {
    "dkvstream": "dkvstream",
    "dkvstream.operators": "operators",
    "dkvstream.storage": "storage",
    "dkvstream.assets": "assets",
    "dkvstream.examples": "examples",
}

setup(
    package_dir=PACKAGE_DIRS,
    packages=[name for package, folder in PACKAGE_DIRS.items()
              for name in [package, *(f"{package}.{sub}" for sub in find_packages(folder))]],
    ext_modules=[
        Extension(
            "dkvstream.storage.dkv._native",
            ["storage/dkv/_native.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Werror"],
            optional=True,
        )
    ],
)
