"""The shipped data in the wheel and the sdist (everything else is in pyproject.toml).

The prompt sets, the MT-Bench split, the classifiers, the pair files and the shapes stay at the
checkout's top (data/, models/, configs/), where the README, the tests and the bench scripts name
them; a wheel carries them as package data under disco/_shipped/ at the same relative paths, where
disco/base/shipped.py finds them through importlib.resources. What ships is disco/base/shipped.py's SHIPPED
(small files only; loaded alone here, since disco's dependencies are not in the build environment).
An editable install (`make install`) copies nothing: disco/base/shipped.py then reads the checkout."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

TOP = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_disco_shipped", TOP / "disco" / "base" / "shipped.py")
shipped = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shipped)


class BuildPyWithData(build_py):
    """build_py, then the shipped files copied into the built package's _shipped/ folder."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for rel in shipped.shipped_files(TOP):
            dest = Path(self.build_lib) / "disco" / shipped.PACKAGED / rel
            self.mkpath(str(dest.parent))
            self.copy_file(str(TOP / rel), str(dest))


class SdistWithData(sdist):
    """sdist with the shipped files at their checkout paths, so a wheel built from it carries them too."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, [*files, *shipped.shipped_files(TOP)])


setup(cmdclass={"build_py": BuildPyWithData, "sdist": SdistWithData})
