"""validate carries the performance model's prediction and the checkpoint-interval (goodput) rule."""

from kilocard.config.compose import compose, to_run_config
from kilocard.validate import validate


def _report(*overrides):
    return validate(to_run_config(compose(list(overrides))))


def test_valid_config_carries_predicted_step_time_and_mfu():
    pred = _report("recipe=llama3_70b").estimates.prediction
    assert pred.step_time_s > 0 and 0 < pred.mfu < 1
    assert pred.convention == "megatron_current" and pred.peak_flops == 989e12
    assert abs(sum(pred.breakdown.values()) - pred.step_time_s) < 1e-6 * pred.step_time_s


def test_invalid_config_has_no_prediction():
    rep = _report("recipe=llama3_70b", "parallel.tensor_model_parallel_size=3")
    assert not rep.valid and rep.estimates.prediction is None and "prediction" not in rep.to_dict()["estimates"]


def test_far_checkpoint_interval_is_warned_with_young_daly_hint():
    rep = _report("recipe=llama31_405b", "checkpoint.save_interval=100000", "trainer.train_iters=200000")
    hits = [i for i in rep.issues if i.code == "CHECKPOINT_INTERVAL"]
    assert hits and hits[0].field == "checkpoint.save_interval" and "Young/Daly" in hits[0].hint
