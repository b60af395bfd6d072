"""Bad input and unsupported contexts: jvpc.Error (a RuntimeError) with a one-line message;
a Python exception raised inside func reaches the caller as it was."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import jvpc


def x64(*shape):
    return torch.rand(*shape, dtype=torch.float64) + 0.5


def refused(match, f, *primals):
    with pytest.raises(jvpc.Error, match=match) as info:
        jvpc.linearize(f, *primals)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, RuntimeError)


def test_op_without_a_rule():
    refused("no JVP rule for aten::special_zeta", lambda x: torch.special.zeta(x, x), x64(4))


# (torch.func.grad, vjp and jacrev inside func are traced: test_forward_over_reverse.py)
@pytest.mark.parametrize("transform", ["vmap", "jvp"])
def test_torch_func_transforms_inside_func(transform):
    def f(x):
        if transform == "vmap":
            return torch.func.vmap(torch.sin)(x)
        return torch.func.jvp(torch.sin, (x,), (x,))[1]
    refused("inside a torch.func transform", f, x64(2, 3))


def test_linearize_inside_a_transform():
    with pytest.raises(jvpc.Error, match="inside a torch.func transform"):
        torch.func.vmap(lambda x: jvpc.linearize(torch.sin, x)[0])(x64(2, 3))


@pytest.mark.parametrize("warm", [False, True])
def test_torch_compiled_code_inside_func_runs_eagerly_and_traces(warm):
    compiled = torch.compile(lambda x: x.sin() * 2, backend="eager", dynamic=False)
    lin = torch.nn.Linear(4, 4).double()
    module = torch.compile(lin)  # an OptimizedModule: its weights are the wrapped module's
    x = x64(4)
    if warm:
        compiled(x)  # a cached compilation, whose code would run outside the dispatcher
        module(x)
    f = lambda x: module(compiled(x) + 1)  # noqa: E731
    out, jvp_fn = jvpc.linearize(f, x)
    torch.testing.assert_close(out, lin(x.sin() * 2 + 1))
    torch.testing.assert_close(jvp_fn(torch.ones_like(x)), torch.func.jvp(lambda x: lin(x.sin() * 2 + 1), (x,),
                                                                          (torch.ones_like(x),))[1])
    prog = jvpc.compile(f, x)
    with torch.no_grad():
        lin.weight.mul_(2)  # read by name through the compiled module
    torch.testing.assert_close(prog(x)[0], lin(x.sin() * 2 + 1))


@torch.library.custom_op("jvpc_test::no_rule", mutates_args=())
def no_rule(x: torch.Tensor) -> torch.Tensor:
    return x.sin()


@no_rule.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("jvpc_test::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    return x.sin()


def test_custom_op_without_a_rule():
    refused("no JVP rule for jvpc_test::no_rule", no_rule, x64(4))
    refused("jvpc_test::no_fake", no_fake, x64(4))


def test_wrong_tangents():
    x = {"a": x64(3), "b": [x64(2)]}
    _, jvp_fn = jvpc.linearize(lambda d: d["a"].sum() * d["b"][0], x)
    good = {"a": x64(3), "b": [x64(2)]}
    jvp_fn(good)
    cases = [
        (({"a": x64(3)},), "structure of the primals"),
        ((good, good), "structure of the primals"),
        (({"a": x64(4), "b": [x64(2)]},), "expected shape"),
        (({"a": x64(3).float(), "b": [x64(2)]},), "expected dtype"),
        (({"a": x64(3).to("meta"), "b": [x64(2)]},), "expected device"),
        (({"a": 1.0, "b": [x64(2)]},), "not a Tensor"),
    ]
    for tangents, match in cases:
        with pytest.raises(jvpc.Error, match=match) as info:
            jvp_fn(*tangents)
        assert "\n" not in str(info.value)


def test_captured_constant_written_since_linearize():
    w = x64(3)
    _, jvp_fn = jvpc.linearize(lambda x: (x * w).sin(), x64(3))
    jvp_fn(x64(3))
    with torch.no_grad():
        w.add_(1)  # an optimizer step, say
    with pytest.raises(jvpc.Error, match="written in place"):
        jvp_fn(x64(3))


def test_module_parameter_updated_since_linearize():
    lin = torch.nn.Linear(3, 3).double()
    _, jvp_fn = jvpc.linearize(lambda x: F.gelu(lin(x)), x64(2, 3))
    with torch.no_grad():
        lin.weight.mul_(2)
    with pytest.raises(jvpc.Error, match="written in place"):
        jvp_fn(x64(2, 3))


def test_python_exception_keeps_its_type_and_message():
    class Custom(Exception):
        pass

    def f(x):
        raise Custom("from inside func")

    with pytest.raises(Custom, match="from inside func"):
        jvpc.linearize(f, x64(3))
    with pytest.raises(KeyError):
        jvpc.linearize(lambda x: {}["missing"], x64(3))


def test_torch_error_inside_func_is_torch_s():
    with pytest.raises(RuntimeError, match="size of tensor a") as info:
        jvpc.linearize(lambda x: x + x64(4), x64(3))
    assert not isinstance(info.value, jvpc.Error)


def test_non_tensor_output():
    with pytest.raises(jvpc.Error, match="pytree of Tensors"):
        jvpc.linearize(lambda x: (x, 3), x64(3))


def test_bad_argnums():
    with pytest.raises(jvpc.Error, match="out of range"):
        jvpc.linearize(lambda x: x, x64(3), argnums=2)
    with pytest.raises(jvpc.Error, match="argnums must be"):
        jvpc.linearize(lambda x: x, x64(3), argnums="x")


def test_bad_disabled_pass():
    o = jvpc.LinearizeOptions()
    o.disabled_passes = {"fold"}
    with pytest.raises(jvpc.Error, match="cannot be disabled"):
        jvpc.linearize(torch.sin, x64(3), options=o)


def test_the_torch_built_against_is_the_one_imported():
    assert jvpc._build.torch_version == torch.__version__.split("+")[0]


def test_import_under_another_torch_is_one_line_naming_both(tmp_path):
    """A build of jvpc loads only under the torch release it was built against (jvpc/_build.py):
    the package, with another release recorded, refuses to load before its extension does."""
    shutil.copytree(os.path.dirname(jvpc.__file__), tmp_path / "jvpc", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "jvpc" / "_build.py").write_text('torch_version = "2.10.0"\n')
    r = subprocess.run([sys.executable, "-c", "import jvpc"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        f"ImportError: jvpc was built against torch 2.10.0 but torch {torch.__version__} is installed: "
        "rebuild jvpc with this torch")
