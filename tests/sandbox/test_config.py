"""The sandbox's configuration: resolved once per process, resolved again when settings change."""

from __future__ import annotations

import pickle

import pytest
from django.test import override_settings

from evaluators.sandbox import SandboxError, run_batch
from evaluators.sandbox.config import load_config, reset_config

from .conftest import call


def test_it_resolves_the_configuration_once_per_process():
    reset_config()
    first = load_config()
    assert load_config() is first


def test_it_resolves_it_again_when_a_sandbox_setting_changes(settings):
    before = load_config()
    settings.EVALSITE_SANDBOX_MEMORY_MB = 99
    assert load_config().memory_mb == 99
    with override_settings(EVALSITE_SANDBOX_MEMORY_MB=77, EVALSITE_CODE_RUNNER="inprocess"):
        assert (load_config().memory_mb, load_config().runner) == (77, "inprocess")
    assert (load_config().memory_mb, load_config().runner) == (99, before.runner)
    settings.EVALSITE_SANDBOX_MEMORY_MB = before.memory_mb
    assert load_config() == before


def test_it_keeps_the_configuration_when_another_setting_changes(settings):
    first = load_config()
    settings.EVALSITE_INTERACTIVE_SLOTS = 7
    assert load_config() is first


def test_it_runs_with_a_setting_changed_between_two_calls(settings):
    code = "def evaluate(inputs, outputs, trace):\n    return 1\n"
    kwargs = {"project_key": "acme", "runtime": "python", "code": code, "version": "2"}
    assert run_batch(revision_key="cfg", calls=[call()], **kwargs)[0].value == 1
    settings.EVALSITE_CODE_RUNNER = "nonsense"
    with pytest.raises(SandboxError, match="EVALSITE_CODE_RUNNER='nonsense' must be one of"):
        run_batch(revision_key="cfg", calls=[call()], **kwargs)


def test_it_reads_the_environment_again_after_a_reset(sandbox_env):
    sandbox_env("EVALSITE_SANDBOX_TMP_MB", "3")
    assert load_config().tmp_mb == 3
    sandbox_env("EVALSITE_SANDBOX_TMP_MB", "oops")
    with pytest.raises(SandboxError, match="EVALSITE_SANDBOX_TMP_MB='oops' is not a int"):
        load_config()


def test_it_hashes_a_configuration_by_value():
    config = load_config()
    twin = config.with_()
    assert twin is not config and twin == config and hash(twin) == hash(config)
    assert config.with_(memory_mb=config.memory_mb + 1) != config
    # A hash is never carried in a pickle: another process hashes strings differently.
    copied = pickle.loads(pickle.dumps(config))
    assert "_hash" not in copied.__dict__ and copied == config
