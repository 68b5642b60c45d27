"""Start-up: `groklens train` imports only what training needs, and the hooks stay TransformerLens'.

Each check runs in a fresh interpreter: what a test process imported before would hide it.
"""

import json
import subprocess
import sys

from tests.helpers import TINY, config_flags, tiny_config

HEAVY = ("transformers", "datasets", "pandas", "pytest", "torch._dynamo")


def _python(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cli_import_and_one_step_train_skip_the_heavy_imports(tmp_path):
    code = (
        "import json, sys\n"
        "import groklens.cli\n"
        f"after_import = [m for m in {HEAVY!r} + ('torch', 'transformer_lens') if m in sys.modules]\n"
        "try:\n    groklens.cli.main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        f"print(json.dumps({{'after_import': after_import, 'heavy': [m for m in {HEAVY!r} if m in sys.modules],\n"
        "    'hooks': 'transformer_lens.hook_points' in sys.modules}))\n"
    )
    flags = config_flags(tiny_config(steps=1, eval_every=1, checkpoint_every=1))
    got = _python(code, "train", "-q", "-o", str(tmp_path / "r.h5"), *flags)
    assert got == {"after_import": [], "heavy": [], "hooks": True}


def test_run_with_cache_gives_a_real_activation_cache_whose_helpers_work():
    code = (
        "import json, sys, torch\n"
        "from groklens.config import RunConfig\n"
        "from groklens.models import build_model\n"
        "from groklens.tasks import TASKS\n"
        f"cfg = RunConfig.from_dict({dict(TINY, n_layers=2, norm='ln')!r})\n"
        "data = TASKS.get(cfg.task).build(cfg)\n"
        "model = build_model(cfg, data)\n"
        "x = data.inputs[:7]\n"
        "before = [m for m in ('transformers', 'datasets', 'pandas') if m in sys.modules]\n"
        "logits, cache = model.run_with_cache(x)\n"
        "import transformer_lens\n"
        "from transformer_lens import ActivationCache, HookedRootModule\n"
        "from transformer_lens.hook_points import HookPoint\n"
        "ok = {'cache_is_tl': isinstance(cache, ActivationCache), 'model_is_tl': isinstance(model, HookedRootModule),\n"
        "      'hookpoints': sum(isinstance(m, HookPoint) for m in model.modules()) == len(model.hook_dict) > 0,\n"
        "      'logits': torch.allclose(logits, model(x), atol=1e-5)}\n"  # no hook: the fused-attention path
        "acc, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)\n"
        "expect = [cache[f'blocks.{l}.hook_resid_{k}'] for l in range(2) for k in ('pre', 'mid')]\n"
        "expect.append(cache['blocks.1.hook_resid_post'])\n"
        "ok['accumulated_resid'] = all(torch.equal(a, e) for a, e in zip(acc, expect)) and len(acc) == 5\n"
        "ok['act_name'] = torch.equal(cache['resid_post', 1], cache['blocks.1.hook_resid_post'])\n"
        "ok['stack'] = torch.equal(cache.stack_activation('pattern')[0], cache['blocks.0.attn.hook_pattern'])\n"
        "dec = cache.decompose_resid(layer=None, return_labels=False)\n"
        "ok['decompose_resid'] = torch.allclose(dec.sum(0), cache['blocks.1.hook_resid_post'], atol=1e-5)\n"
        "ok['package_complete'] = transformer_lens.TransformerBridge.__name__ == 'TransformerBridge'\n"
        "ok['deferred_until_use'] = before == []\n"
        "print(json.dumps(ok))\n"
    )
    got = _python(code)
    assert got == dict.fromkeys(got, True) and len(got) == 10


def test_transformer_lens_imported_first_is_left_alone():
    code = (
        "import json, sys, transformer_lens\n"
        "from groklens._tl import defer_package_inits\n"
        "from groklens.models import build_model\n"
        "print(json.dumps({'deferred': defer_package_inits(),\n"
        "                  'same': sys.modules['transformer_lens'] is transformer_lens}))\n"
    )
    assert _python(code) == {"deferred": False, "same": True}


def test_a_moved_leaf_falls_back_to_the_full_import():
    # another TransformerLens layout: the name is not where _LEAVES says; the package's own
    # __init__ must then resolve it (the slow, correct path)
    code = (
        "import json, sys\n"
        "import groklens._tl as tl\n"
        "tl._LEAVES['transformer_lens']['HookedRootModule'] = 'no_such_module'\n"
        "from groklens.config import RunConfig\n"
        "from groklens.models import build_model\n"
        "from groklens.tasks import TASKS\n"
        f"cfg = RunConfig.from_dict({TINY!r})\n"
        "model = build_model(cfg, TASKS.get(cfg.task).build(cfg))\n"
        "from transformer_lens import ActivationCache, HookedRootModule\n"
        "_, cache = model.run_with_cache(TASKS.get(cfg.task).build(cfg).inputs[:3])\n"
        "print(json.dumps({'tl': isinstance(model, HookedRootModule), 'full': 'transformers' in sys.modules,\n"
        "                  'cache': isinstance(cache, ActivationCache)}))\n"
    )
    assert _python(code) == {"tl": True, "full": True, "cache": True}
