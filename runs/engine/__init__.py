"""The run engine: runs created and submitted, cut into leased work units, cells computed and
written once, progress and the end of a run, operations, and SDK-style logged runs."""

from runs.engine.annotate import scenario_annotate
from runs.engine.cells import (
    Cell,
    LeaseLost,
    cells_write,
    run_counters_add,
    scenario_statuses_update,
)
from runs.engine.create import (
    run_create,
    run_execute_inline,
    run_start,
    run_submit,
    run_update,
)
from runs.engine.estimate import (
    CHARS_PER_TOKEN,
    COMPLETION_GUESS,
    connection_price,
    cost_usd,
    estimate_check,
    message_tokens,
    run_estimate,
)
from runs.engine.locks import run_check_open, run_locked
from runs.engine.logged import results_log, run_create_logged, scenarios_add
from runs.engine.operations import (
    run_add_evaluators,
    run_cancel,
    run_close,
    run_retry_failed,
    run_slug_name,
)
from runs.engine.process import run_dispatch, unit_fail, unit_process, unit_work, units_sweep
from runs.engine.progress import (
    PACK_GRACE,
    read_model_pack,
    read_model_packs_sweep,
    read_model_refresh,
    run_final_status,
    run_finish_if_complete,
    run_is_logged,
    run_is_online,
    run_metrics_refresh_request,
    run_progress_update,
)
from runs.engine.steps import (
    PEOPLE_KINDS,
    annotation_step,
    step_key_for_application,
    step_key_for_revision,
    step_key_for_testset,
    step_lane,
)
from runs.engine.tags import tag_filters_parse, tags_text_parse, tags_validate
from runs.engine.units import unit_claim, unit_complete, units_plan, units_requeue_cancelled

__all__ = [
    "CHARS_PER_TOKEN",
    "COMPLETION_GUESS",
    "PACK_GRACE",
    "PEOPLE_KINDS",
    "Cell",
    "LeaseLost",
    "annotation_step",
    "cells_write",
    "connection_price",
    "cost_usd",
    "estimate_check",
    "message_tokens",
    "read_model_pack",
    "read_model_packs_sweep",
    "read_model_refresh",
    "results_log",
    "run_add_evaluators",
    "run_cancel",
    "run_check_open",
    "run_close",
    "run_counters_add",
    "run_create",
    "run_create_logged",
    "run_dispatch",
    "run_estimate",
    "run_execute_inline",
    "run_final_status",
    "run_finish_if_complete",
    "run_is_logged",
    "run_is_online",
    "run_locked",
    "run_metrics_refresh_request",
    "run_progress_update",
    "run_retry_failed",
    "run_slug_name",
    "run_start",
    "run_submit",
    "run_update",
    "scenario_annotate",
    "scenario_statuses_update",
    "scenarios_add",
    "step_key_for_application",
    "step_key_for_revision",
    "step_key_for_testset",
    "step_lane",
    "tag_filters_parse",
    "tags_text_parse",
    "tags_validate",
    "unit_claim",
    "unit_complete",
    "unit_fail",
    "unit_process",
    "unit_work",
    "units_plan",
    "units_requeue_cancelled",
    "units_sweep",
]
