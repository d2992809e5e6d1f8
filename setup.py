"""Build the Cython core: the kernels (crnet/coding/_core.pyx, against numpy's headers) and the
frame reader (crnet/protocol/_frames.pyx).

Everything else about the package lives in pyproject.toml; setuptools still needs
this file to declare a compiled extension.
"""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "crnet.coding._core",
        ["crnet/coding/_core.pyx"],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    ),
    Extension("crnet.protocol._frames", ["crnet/protocol/_frames.pyx"], extra_compile_args=["-O3"]),
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    )
)
