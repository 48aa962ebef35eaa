"""Package discovery over pyproject's package-dir mapping (everything else is in pyproject.toml).

setuptools' declarative `packages.find` searches folders for top-level packages; it cannot
prefix the packages it finds below core/, storage/, app/ with `specscope.`. This finds them
and names them, so a subpackage is installed the moment it has an __init__.py.
"""

from setuptools import find_packages, setup

FOLDERS = {
    "specscope.core": "core",
    "specscope.storage": "storage",
    "specscope.app": "app",
    "specscope.resources": "resources",
}

setup(
    packages=[
        name
        for package, folder in FOLDERS.items()
        for name in (package, *(f"{package}.{sub}" for sub in find_packages(folder)))
    ]
)
