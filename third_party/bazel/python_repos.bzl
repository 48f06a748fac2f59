"""Repository rules exposing headers of the installed Python packages.

Bazel builds jax_blink offline against what pip installed: the Python C API
headers, pybind11's headers and the XLA FFI headers shipped with jaxlib
(``jax.ffi.include_dir()``). The interpreter is $PYTHON_BIN_PATH, else
``python3`` on $PATH.
"""

_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.inc"]),
    includes = ["include"],
)
"""

def _python(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH", "python3")
    path = ctx.which(python) if "/" not in python else ctx.path(python)
    if path == None:
        fail("jax_blink: cannot find the Python interpreter %r (set PYTHON_BIN_PATH)" % python)
    return path

def _query(ctx, code):
    res = ctx.execute([_python(ctx), "-c", code])
    if res.return_code != 0:
        fail("jax_blink: %s failed:\n%s" % (code, res.stderr))
    return res.stdout.strip()

def _local_headers_impl(ctx):
    include = _query(ctx, ctx.attr.query)
    ctx.symlink(include, "include")
    ctx.file("BUILD", _BUILD)

local_headers_repository = repository_rule(
    implementation = _local_headers_impl,
    attrs = {"query": attr.string(mandatory = True)},
    environ = ["PYTHON_BIN_PATH", "PATH"],
    local = True,
)

def jax_blink_python_repositories():
    """Declares @python_headers, @pybind11_headers and @xla_ffi_headers."""
    local_headers_repository(
        name = "python_headers",
        query = "import sysconfig; print(sysconfig.get_paths()['include'])",
    )
    local_headers_repository(
        name = "pybind11_headers",
        query = "import pybind11; print(pybind11.get_include())",
    )
    local_headers_repository(
        name = "xla_ffi_headers",
        query = "import os, jaxlib; print(os.path.join(os.path.dirname(os.path.abspath(jaxlib.__file__)), 'include'))",
    )

def _suffix_impl(ctx):
    suffix = _query(ctx, "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
    ctx.file("BUILD", "")
    ctx.file("defs.bzl", "EXT_SUFFIX = %r\n" % suffix)

python_ext_suffix_repository = repository_rule(
    implementation = _suffix_impl,
    environ = ["PYTHON_BIN_PATH", "PATH"],
    local = True,
)
