"""The package list, found rather than typed.

Everything else is declared in pyproject.toml. The four top-level folders are mapped
into the ``veil`` namespace there (``[tool.setuptools.package-dir]``), and setuptools'
own ``packages.find`` cannot prefix what it finds with ``veil.``, so this file lists
every folder below them that is a package (has an ``__init__.py``) under its import
name. A new subpackage is in the wheel without an edit here or in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = ("client", "server", "shared", "simulations")

setup(
    packages=[
        f"veil.{folder}{'.' + sub if sub else ''}"
        for folder in FOLDERS
        for sub in ["", *find_packages(folder)]
    ],
)
