"""fedfuse's differential privacy against Flower's: the same clipping and aggregate as Flower's DP
strategy wrappers on the same replies, and the same epsilon as dp-accounting's RDP accountant
(the backend of Flower's own accountant)."""

import numpy as np
import pytest

pytest.importorskip("flwr")
dp_accounting = pytest.importorskip("dp_accounting")
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.strategy import (  # noqa: E402
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

import fedfuse  # noqa: E402
from conftest import ROOT  # noqa: E402
from fedfuse.flwr import Strategy, to_recorddict  # noqa: E402

CONFIG = ROOT / "examples" / "flower" / "fedfuse_quickstart" / "run.toml"
CLIENTS = 4


def config_with(tmp_path, privacy):
    path = tmp_path / "run.toml"
    path.write_text(CONFIG.read_text() + "\n[privacy]\n" + privacy + "\n")
    return path


def replies_for(messages, model, updates):
    """Replies as a Grid delivers them: slot i sends the global model + updates[i], equal weights
    (the DP mean weighs replies equally, as Flower's accounted mode requires)."""
    for m in messages:
        m.metadata.__dict__["_message_id"] = m.object_id
    return [
        Message(
            RecordDict({
                "arrays": ArrayRecord({k: Array(model[k] + u[k]) for k in model}),
                "metrics": MetricRecord({"num-examples": 50}),
            }),
            reply_to=m,
        )
        for m, u in zip(messages, updates)
    ]


def updates_of(model, rng, scales):
    return [{k: (s * rng.standard_normal(v.shape)).astype(np.float32) for k, v in model.items()} for s in scales]


def flower_round(flower, model, updates, server_round):
    """Flower's wrapper over FedAvg on the same replies (it clips against the arrays it was given
    in configure_train)."""
    arrays = ArrayRecord({k: Array(v) for k, v in model.items()})
    flower.configure_train(server_round, arrays, ConfigRecord(), _Grid())
    messages = [Message(RecordDict({}), dst_node_id=i + 1, message_type="train") for i in range(len(updates))]
    out, _ = flower.aggregate_train(server_round, replies_for(messages, model, updates))
    return {k: a.numpy() for k, a in out.items()}


class _Grid:
    """Just enough of a Grid for FedAvg.configure_train: CLIENTS connected nodes."""

    def get_node_ids(self):
        return list(range(1, CLIENTS + 1))

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)


def fedfuse_round(strategy, server_round):
    """fedfuse's Strategy: its instructions for every slot, and the global model it sent."""
    strategy.slots = {node: node - 1 for node in range(1, CLIENTS + 1)}
    messages = list(strategy.configure_train(server_round, ArrayRecord(), ConfigRecord(), None))
    model = {k: a.numpy() for k, a in to_recorddict(strategy._server.global_model())["arrays"].items()}
    return messages, model


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


def test_fixed_clipping_without_noise_equals_flowers_clipping_and_fedavg(tmp_path):
    cfg = config_with(tmp_path, 'kind = "central-fixed"\nnoise_multiplier = 0.0\nclipping_norm = 0.5')
    strategy = Strategy(cfg, [f"clients={CLIENTS}", "rounds=1"])
    messages, model = fedfuse_round(strategy, 1)
    # Two updates far outside the ball, two inside: the clipping must matter.
    updates = updates_of(model, np.random.default_rng(0), [0.5, 0.001, 0.2, 0.0005])
    norms = [np.sqrt(sum(float(np.sum(u[k].astype(np.float64) ** 2)) for k in u)) for u in updates]
    assert sum(n > 0.5 for n in norms) == 2 and sum(n < 0.5 for n in norms) == 2, norms
    arrays, _ = strategy.aggregate_train(1, replies_for(messages, model, updates))
    ours = {k: a.numpy() for k, a in arrays.items()}

    flower = DifferentialPrivacyServerSideFixedClipping(FedAvg(min_train_nodes=CLIENTS), 0.0, 0.5, CLIENTS)
    theirs = flower_round(flower, model, updates, 1)
    plain = {k: model[k] + sum(u[k] for u in updates) / CLIENTS for k in model}
    for k in model:
        np.testing.assert_allclose(ours[k], theirs[k], atol=1e-6, rtol=0, err_msg=k)
        assert np.abs(ours[k] - plain[k]).max() > 1e-3, k  # unclipped FedAvg is elsewhere
    metrics = strategy.rounds[-1]["method"]
    assert metrics["dp_clipping_norm"] == 0.5 and metrics["dp_noise_std"] == 0.0
    assert "dp_epsilon" not in metrics  # no noise, no privacy to report


def test_adaptive_clipping_clips_as_flower_and_moves_its_norm_as_the_paper(tmp_path):
    # No noise on the model nor on the count: every step is deterministic.
    cfg = config_with(
        tmp_path,
        'kind = "central-adaptive"\nnoise_multiplier = 0.0\ninitial_clipping_norm = 0.1\n'
        "clipped_count_stddev = 0.0\ntarget_quantile = 0.5\nclip_lr = 0.2",
    )
    strategy = Strategy(cfg, [f"clients={CLIENTS}", "rounds=3"])
    flower = DifferentialPrivacyServerSideAdaptiveClipping(
        FedAvg(min_train_nodes=CLIENTS), 0.0, CLIENTS, initial_clipping_norm=0.1,
        target_clipped_quantile=0.5, clip_norm_lr=0.2, clipped_count_stddev=0.0,
    )
    rng = np.random.default_rng(1)
    ours_c = []
    for server_round in (1, 2, 3):
        messages, model = fedfuse_round(strategy, server_round)
        # Update norms about 3.5, 0.035, 0.055, 0.07 (4.8k values): one of four outside C.
        updates = updates_of(model, rng, [0.05, 0.0005, 0.0008, 0.001])
        theirs = flower_round(flower, model, updates, server_round)
        arrays, _ = strategy.aggregate_train(server_round, replies_for(messages, model, updates))
        metrics = strategy.rounds[-1]["method"]
        ours_c.append(metrics["dp_clipping_norm"])
        assert metrics["dp_clipped_fraction"] == pytest.approx(0.25), server_round
        if server_round == 1:  # the same clipping norm (0.1) gives the same clipped mean
            for k, a in arrays.items():
                np.testing.assert_allclose(a.numpy(), theirs[k], atol=1e-6, rtol=0, err_msg=k)
    assert ours_c[0] == 0.1
    # Three of four inside C against a target of half: Andrew et al. shrink C towards the
    # median norm, by e^{-0.2 (0.75 - 0.5)} a round. Flower 1.41 feeds the clipped fraction
    # (0.25) into the same formula and grows C away from it, by e^{0.05} a round.
    assert ours_c[1:] == pytest.approx([0.1 * np.exp(-0.05), 0.1 * np.exp(-0.1)], rel=1e-12)
    assert flower.clipping_norm == pytest.approx(0.1 * np.exp(0.15), rel=1e-12)


@pytest.mark.parametrize(
    "q, z, steps, delta",
    [(1.0, 1.0, 10, 1e-5), (0.01, 1.1, 1000, 1e-5), (0.1, 0.8, 50, 1e-6), (0.003, 2.0, 10_000, 1e-5), (0.5, 5.0, 3, 1e-3)],
)
def test_epsilon_equals_dp_accountings_rdp_accountant(q, z, steps, delta):
    from dp_accounting import dp_event
    from dp_accounting.rdp import RdpAccountant

    event = dp_event.GaussianDpEvent(z) if q == 1.0 else dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))
    acc = RdpAccountant()
    acc.compose(event, steps)
    want, want_order = acc.get_epsilon_and_optimal_order(delta)
    got, order = fedfuse.rdp_epsilon(q, z, steps, delta)
    assert got == pytest.approx(want, rel=1e-3), (got, want)
    assert order == want_order


def test_a_run_reports_epsilon_per_round_as_flowers_accountant_does(tmp_path):
    from flwr.supercore.privacy_accounting import (
        GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, SamplingMethod,
    )
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    cfg = config_with(tmp_path, 'kind = "central-fixed"\nnoise_multiplier = 1.5\nclipping_norm = 1.0\ndelta = 1e-4')
    strategy = Strategy(cfg, [f"clients={CLIENTS}", "rounds=3"])
    flower = RdpAccountant(PrivacyConfig(
        target_delta=1e-4, population_size=CLIENTS,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION,
    ))
    rng = np.random.default_rng(2)
    for server_round in (1, 2, 3):
        messages, model = fedfuse_round(strategy, server_round)
        strategy.aggregate_train(server_round, replies_for(messages, model, updates_of(model, rng, [0.01] * CLIENTS)))
        flower.compose(GaussianPrivacyEvent(noise_multiplier=1.5, sample_size=CLIENTS, population_size=CLIENTS))
        metrics = strategy.rounds[-1]["method"]
        assert metrics["dp_epsilon"] == pytest.approx(flower.get_privacy_spent().epsilon, rel=1e-3)
        assert metrics["dp_noise_std"] == pytest.approx(1.5 * 1.0 / CLIENTS)


def test_poisson_sampling_reports_flowers_poisson_accounting(tmp_path):
    from flwr.supercore.privacy_accounting import (
        GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, SamplingMethod,
    )
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    cfg = config_with(tmp_path, 'kind = "central-fixed"\nnoise_multiplier = 1.5\nclipping_norm = 1.0\ndelta = 1e-4')
    strategy = Strategy(cfg, [f"clients={CLIENTS}", "rounds=6", "clients_per_round=0.5", 'sampling="poisson"'])
    flower = RdpAccountant(PrivacyConfig(
        target_delta=1e-4, population_size=CLIENTS,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.POISSON,
    ))
    rng = np.random.default_rng(2)
    sizes = []
    for server_round in range(1, 7):
        messages, model = fedfuse_round(strategy, server_round)
        sizes.append(len(messages))
        strategy.aggregate_train(
            server_round, replies_for(messages, model, updates_of(model, rng, [0.01] * len(messages)))
        )
        # Each round is one Poisson-sampled Gaussian at q = 2 / 4, however many were drawn.
        flower.compose(GaussianPrivacyEvent(noise_multiplier=1.5, sample_size=2, population_size=CLIENTS))
        metrics = strategy.rounds[-1]["method"]
        assert metrics["dp_epsilon"] == pytest.approx(flower.get_privacy_spent().epsilon, rel=1e-3)
        assert metrics["dp_noise_std"] == pytest.approx(1.5 * 1.0 / 2)
    assert len(set(sizes)) > 1, sizes


def test_a_poisson_round_that_draws_no_node_still_releases_and_accounts(tmp_path):
    cfg = config_with(tmp_path, 'kind = "central-fixed"\nnoise_multiplier = 1.5\nclipping_norm = 1.0\ndelta = 1e-4')
    # q = 0.25 over 4 clients: a round draws nobody with probability 0.32.
    strategy = Strategy(cfg, [f"clients={CLIENTS}", "rounds=8", "clients_per_round=0.25", 'sampling="poisson"'])
    empty = 0
    for server_round in range(1, 9):
        before = strategy._server.global_model()
        messages, model = fedfuse_round(strategy, server_round)
        if not messages:
            empty += 1
            strategy.aggregate_train(server_round, [])
            after = strategy._server.global_model()
            # The model moved by noise alone.
            assert any(a[4] != b[4] for a, b in zip(before[0], after[0]))
        else:
            strategy.aggregate_train(
                server_round, replies_for(messages, model, updates_of(model, np.random.default_rng(server_round), [0.01] * len(messages)))
            )
        metrics = strategy.rounds[-1]
        assert metrics["clients"] == len(messages)
        assert metrics["method"]["dp_noise_std"] == pytest.approx(1.5 * 1.0 / 1.0)
        assert "dp_epsilon" in metrics["method"]
    assert empty > 0
