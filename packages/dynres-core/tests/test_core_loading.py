"""Policy discovery through ``dynres.policies`` entry points, with throwaway distributions."""

from __future__ import annotations

import pytest
from core_helpers import make_ctx

from dynres.core import (
    POLICIES_GROUP,
    Policy,
    clear_policy_cache,
    installed_policies,
    load_policy,
    resolve_policy_class,
)
from dynres.core.errors import (
    DuplicatePolicyError,
    PolicyError,
    PolicyImportError,
    PolicyNotFoundError,
    PolicyParamsError,
    PolicyValidationError,
)

GOOD = '''
from pydantic import Field
from dynres.core import Policy, ScheduleContext


class AcmeRatio(Policy):
    """Test policy."""

    name = "acme_ratio"

    class Params(Policy.Params):
        floor: float = Field(0.5, ge=0.0, le=1.0)

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        return int(self.params.floor * ctx.step_required_samples)

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        return True
'''


def _named(name: str, cls: str = "P") -> str:
    return f'''
from dynres.core import Policy


class {cls}(Policy):
    name = "{name}"

    def should_deactivate(self, ctx):
        return False

    def deactivate_wait_samples(self, ctx):
        return 0

    def should_activate_after_step(self, ctx):
        return False
'''


def test_group_name_is_the_contract():
    assert POLICIES_GROUP == "dynres.policies"


def test_good_distribution_is_found_by_name(make_dist):
    dist = make_dist("acme-policies", version="2.3", modules={"acme": GOOD}, policies={"acme_ratio": "acme:AcmeRatio"})
    (entry,) = installed_policies()["acme_ratio"]
    assert (entry.distribution, entry.version) == ("acme-policies", "2.3")
    assert entry.value == f"{dist.module('acme')}:AcmeRatio"

    policy = load_policy("acme_ratio", {"floor": 0.25})
    assert type(policy).__name__ == "AcmeRatio"
    assert type(policy).__module__ == dist.module("acme")
    assert policy.params.model_dump() == {"floor": 0.25}
    assert isinstance(policy, Policy)


def test_good_distribution_by_module_class_path(make_dist):
    dist = make_dist("acme-policies", modules={"acme": GOOD}, policies={"acme_ratio": "acme:AcmeRatio"})
    spec = f"{dist.module('acme')}:AcmeRatio"
    by_path = resolve_policy_class(spec)
    assert by_path is resolve_policy_class("acme_ratio")
    assert resolve_policy_class(f"  {spec}  ") is by_path
    assert load_policy(spec).params.model_dump() == {"floor": 0.5}


def test_module_class_path_works_without_any_entry_point(make_dist):
    dist = make_dist("acme-unregistered", modules={"acme": GOOD})
    assert "acme_ratio" not in installed_policies()
    cls = resolve_policy_class(f"{dist.module('acme')}:AcmeRatio")
    assert cls.name == "acme_ratio"


def test_a_class_is_accepted_directly(make_dist):
    dist = make_dist("acme-policies", modules={"acme": GOOD})
    cls = resolve_policy_class(f"{dist.module('acme')}:AcmeRatio")
    assert resolve_policy_class(cls) is cls
    assert isinstance(load_policy(cls), cls)


def test_duplicate_name_names_both_distributions(make_dist):
    make_dist("acme-one", modules={"one": _named("dup_policy")}, policies={"dup_policy": "one:P"})
    make_dist("acme-two", modules={"two": _named("dup_policy")}, policies={"dup_policy": "two:P"})
    assert len(installed_policies()["dup_policy"]) == 2
    with pytest.raises(DuplicatePolicyError) as info:
        load_policy("dup_policy")
    msg = str(info.value)
    assert "'dup_policy'" in msg and "'acme-one'" in msg and "'acme-two'" in msg
    assert "module:Class" in msg


def test_same_distribution_twice_on_sys_path_counts_once(make_dist):
    # An editable install next to a copy of the same distribution is not a conflict.
    source = _named("twice_policy")
    first = make_dist("acme-twice", modules={"m": source}, policies={"twice_policy": "m:P"}, site="a")
    value = f"{first.module('m')}:P"
    make_dist("acme-twice", policies={"twice_policy": value}, site="b")
    assert len(installed_policies()["twice_policy"]) == 1
    assert load_policy("twice_policy").name == "twice_policy"


def test_import_failure_names_the_distribution(make_dist):
    broken = "import dynres_no_such_module_xyz\n"
    make_dist("acme-broken", modules={"broken": broken}, policies={"broken_policy": "broken:P"})
    with pytest.raises(PolicyImportError) as info:
        load_policy("broken_policy")
    msg = str(info.value)
    assert "'broken_policy'" in msg and "'acme-broken'" in msg
    assert "ModuleNotFoundError" in msg and "dynres_no_such_module_xyz" in msg
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_exception_at_import_time_names_the_distribution(make_dist):
    make_dist(
        "acme-raises", modules={"boom": "raise RuntimeError('boom at import')\n"}, policies={"boom_policy": "boom:P"}
    )
    with pytest.raises(PolicyImportError, match="'acme-raises'.*RuntimeError: boom at import"):
        load_policy("boom_policy")


def test_missing_class_in_module_names_the_distribution(make_dist):
    make_dist("acme-noclass", modules={"m": _named("noclass_policy")}, policies={"noclass_policy": "m:Q"})
    with pytest.raises(PolicyImportError, match="'acme-noclass'"):
        load_policy("noclass_policy")


def test_wrong_signature_names_method_signature_and_distribution(make_dist):
    source = _named("sig_policy").replace(
        "def should_deactivate(self, ctx):", "def should_deactivate(self, global_steps, ctx):"
    )
    make_dist("acme-sig", modules={"m": source}, policies={"sig_policy": "m:P"})
    with pytest.raises(PolicyValidationError) as info:
        load_policy("sig_policy")
    msg = str(info.value)
    assert "should_deactivate(self, global_steps, ctx) has the wrong signature" in msg
    assert "def should_deactivate(self, ctx: ScheduleContext)" in msg
    assert "'acme-sig'" in msg


def test_not_a_policy_subclass(make_dist):
    source = "class NotAPolicy:\n    name = 'plain_policy'\n"
    make_dist("acme-plain", modules={"m": source}, policies={"plain_policy": "m:NotAPolicy"})
    with pytest.raises(PolicyValidationError) as info:
        load_policy("plain_policy")
    msg = str(info.value)
    assert "not a subclass of dynres.core.Policy" in msg and "'acme-plain'" in msg


def test_entry_point_name_must_equal_class_name(make_dist):
    make_dist("acme-mismatch", modules={"m": _named("real_name")}, policies={"alias_name": "m:P"})
    with pytest.raises(PolicyValidationError) as info:
        load_policy("alias_name")
    msg = str(info.value)
    assert "'alias_name'" in msg and "'real_name'" in msg and "'acme-mismatch'" in msg
    assert "make the entry-point name and the class's name attribute equal" in msg


def test_unknown_name_lists_installed_and_suggests(make_dist):
    make_dist("acme-policies", modules={"acme": GOOD}, policies={"acme_ratio": "acme:AcmeRatio"})
    make_dist("acme-more", modules={"m": _named("zebra_policy")}, policies={"zebra_policy": "m:P"})
    with pytest.raises(PolicyNotFoundError) as info:
        load_policy("acme_ratoi")
    msg = str(info.value)
    assert "unknown policy 'acme_ratoi' (did you mean 'acme_ratio'?)" in msg
    installed = msg.split("installed policies: ")[1]
    assert "acme_ratio" in installed and "zebra_policy" in installed
    assert "'dynres.policies'" in msg and "module:Class" in msg


def test_a_name_with_bracketed_params_says_where_the_params_go(make_dist):
    make_dist("acme-policies", modules={"acme": GOOD}, policies={"acme_ratio": "acme:AcmeRatio"})
    with pytest.raises(PolicyNotFoundError) as info:
        load_policy("acme_ratio[ratio=0.5; x=1]")
    msg = str(info.value)
    assert "name it 'acme_ratio'" in msg and "dynamic_schedule_policy_params.ratio=0.5)" in msg
    # A bracket after a name nobody registered is an unknown policy as before.
    with pytest.raises(PolicyNotFoundError, match="unknown policy 'nope"):
        load_policy("nope[ratio=0.5]")


def test_unknown_name_far_from_everything_has_no_suggestion(make_dist):
    make_dist("acme-policies", modules={"acme": GOOD}, policies={"acme_ratio": "acme:AcmeRatio"})
    with pytest.raises(PolicyNotFoundError) as info:
        load_policy("qqqqqqqqqq")
    assert "did you mean" not in str(info.value)


def test_bad_params_name_the_field(make_dist):
    make_dist("acme-policies", modules={"acme": GOOD}, policies={"acme_ratio": "acme:AcmeRatio"})
    with pytest.raises(PolicyParamsError, match=r"policy 'acme_ratio': param 'floor'.*got 2"):
        load_policy("acme_ratio", {"floor": 2})
    with pytest.raises(PolicyParamsError) as info:
        load_policy("acme_ratio", {"flor": 0.5})
    assert "unknown param 'flor' (did you mean 'floor'?)" in str(info.value)


def test_bad_import_paths():
    with pytest.raises(PolicyImportError, match="module 'dynres_no_such_pkg_xyz' failed to import"):
        resolve_policy_class("dynres_no_such_pkg_xyz:Thing")
    with pytest.raises(PolicyImportError, match="has no attribute 'Polcy'.*did you mean 'Policy'"):
        resolve_policy_class("dynres.core:Polcy")
    with pytest.raises(PolicyValidationError, match="not a subclass"):
        resolve_policy_class("dynres.core:ScheduleContext")


@pytest.mark.parametrize("spec", ["", "   ", None, 3])
def test_spec_must_be_a_name_path_or_class(spec):
    with pytest.raises(PolicyError, match="non-empty string or a class"):
        resolve_policy_class(spec)


def test_scan_is_cached_until_cleared(make_dist):
    make_dist("acme-policies", modules={"acme": GOOD}, policies={"acme_ratio": "acme:AcmeRatio"})
    assert "late_policy" not in installed_policies()
    # Written after the scan, as if installed while the process runs.
    make_dist("acme-late", modules={"m": _named("late_policy")}, policies={"late_policy": "m:P"}, clear=False)
    assert "late_policy" not in installed_policies()
    with pytest.raises(PolicyNotFoundError):
        load_policy("late_policy")
    clear_policy_cache()
    assert "late_policy" in installed_policies()
    assert load_policy("late_policy").name == "late_policy"


FILE_POLICY = """
from dynres.core import Policy

class Never(Policy):
    name = "never"

    def should_deactivate(self, ctx):
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx):
        return 0

    def should_activate_after_step(self, ctx):
        return False
"""


def test_file_path_loads_the_class_and_imports_the_file_once(tmp_path):
    pol = tmp_path / "my_policy.py"
    pol.write_text(FILE_POLICY + "\nLOADS = globals().get('LOADS', 0) + 1\n")
    cls = resolve_policy_class(f"{pol}:Never")
    assert cls.name == "never" and cls(None).should_activate_after_step(make_ctx()) is False
    assert resolve_policy_class(f"{pol}:Never") is cls  # same module object, not a second copy
    from dynres.core.config import AsyncTrainingConfig
    from dynres.core.loading import policy_from_config

    at = AsyncTrainingConfig(dynamic_schedule_policy=f"{pol}:Never")
    assert policy_from_config(at).name == "never"


def test_file_path_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(PolicyImportError, match=r"file '.*nope\.py' not found; check the path"):
        resolve_policy_class(f"{tmp_path}/nope.py:Never")
    pol = tmp_path / "p.py"
    pol.write_text(FILE_POLICY)
    with pytest.raises(PolicyImportError, match=r"defines no 'Nevr' \(did you mean 'Never'\?\)"):
        resolve_policy_class(f"{pol}:Nevr")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(PolicyImportError, match="failed to import: RuntimeError: boom; fix the file"):
        resolve_policy_class(f"{broken}:Never")
    with pytest.raises(PolicyValidationError, match="not a subclass"):
        resolve_policy_class(f"{pol}:Policy.__init__")


# ---- Names only a plugin knows: the dynres_resolve_policy hook -----------------------------------


class _Claimed(Policy):
    """A policy only a plugin can name."""

    name = "claimed"

    def should_deactivate(self, ctx):
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx):
        return 0

    def should_activate_after_step(self, ctx):
        return False


def _manager_with(plugin, monkeypatch):
    from dynres.core import plugins

    real = plugins.get_plugin_manager

    def fake(*, load_plugins=None):
        pm = real(load_plugins=False)
        plugins.register_plugin(pm, plugin, name="test-resolver")
        return pm

    monkeypatch.setattr(plugins, "get_plugin_manager", fake)


def test_a_plugin_resolves_names_it_claims_before_module_class_parsing(monkeypatch):
    from dynres.core import hookimpl

    asked = []

    class Resolver:
        @hookimpl
        def dynres_resolve_policy(self, name):
            asked.append(name)
            return _Claimed if name.startswith("acme:") else None

    _manager_with(Resolver(), monkeypatch)
    assert resolve_policy_class("acme:anything") is _Claimed
    assert load_policy("acme:x").name == "claimed"
    assert resolve_policy_class("default").name == "default"  # registered names never ask plugins
    assert asked == ["acme:anything", "acme:x"]
    with pytest.raises(PolicyImportError, match="no_such_module_q"):
        resolve_policy_class("no_such_module_q:Cls")  # unclaimed: read as module:Class
    assert asked[-1] == "no_such_module_q:Cls"


def test_a_plugin_answer_is_validated_like_any_policy_class(monkeypatch):
    from dynres.core import hookimpl

    class Resolver:
        @hookimpl
        def dynres_resolve_policy(self, name):
            return dict

    _manager_with(Resolver(), monkeypatch)
    with pytest.raises(PolicyValidationError, match="not a subclass of dynres.core.Policy"):
        resolve_policy_class("acme:x")


def test_verl_names_without_the_bridge_name_the_package_to_install(monkeypatch):
    _manager_with(object(), monkeypatch)  # no plugin answers
    with pytest.raises(PolicyNotFoundError) as info:
        resolve_policy_class("verl:default")
    assert "pip install dynres-verl" in str(info.value) and "\n" not in str(info.value)


def test_unimportable_module_path_hint_names_pythonpath_and_the_file_form(tmp_path, monkeypatch):
    """A package folder in the current directory that is not on sys.path: the hint says how to reach it."""
    from dynres.core.errors import PolicyImportError
    from dynres.core.loading import resolve_policy_class

    (tmp_path / "my_pkg_not_on_path").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PolicyImportError) as info:
        resolve_policy_class("my_pkg_not_on_path.policies:Mine")
    assert "PYTHONPATH=." in str(info.value) and "my_pkg_not_on_path/policies.py:Mine" in str(info.value)
