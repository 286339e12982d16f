"""The EMA of the trained weights (sage_grpo/optim/ema.py): the update's arithmetic, its state, putting it into the
model and back bit for bit, and its shards under FSDP2 (a fake process group of 2 ranks: each rank holds and updates
half of every tensor, with the weight's mesh and placements)."""
import pytest
import torch
from torch.distributed.tensor import DTensor

from sage_grpo.optim.ema import PolicyEMA


def weights_of(model):
    return {name: param.detach() for name, param in model.named_parameters()}


def test_the_average_follows_its_formula():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    ema = PolicyEMA(weights_of(model), decay=0.75)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[5.0, -2.0]]))
    ema.update()  # 0.75 * [1, 2] + 0.25 * [5, -2] = [2, 1]
    assert ema.state_dict()["weight"].tolist() == [[2.0, 1.0]]
    ema.update()  # 0.75 * [2, 1] + 0.25 * [5, -2] = [2.75, 0.25]
    assert ema.state_dict()["weight"].tolist() == [[2.75, 0.25]]
    assert model.weight.tolist() == [[5.0, -2.0]]  # the weights are never touched
    with pytest.raises(ValueError, match=r"--ema_decay 1.0 must be in \(0, 1\)"):
        PolicyEMA(weights_of(model), decay=1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_applied_puts_the_average_in_and_the_weights_back_bit_for_bit(dtype):
    model = torch.nn.Linear(3, 2).to(dtype)
    ema = PolicyEMA(weights_of(model), decay=0.9)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)).to(dtype))
    ema.update()
    before = {k: v.clone() for k, v in weights_of(model).items()}
    average = {k: v.clone() for k, v in ema.state_dict().items()}
    assert all(v.dtype == torch.float32 for v in average.values())  # fp32 whatever the weights' dtype
    with ema.applied():
        for name, param in model.named_parameters():
            assert torch.equal(param.detach(), average[name].to(dtype))
    for name, param in model.named_parameters():
        assert torch.equal(param.detach(), before[name])
        assert torch.equal(ema.state_dict()[name], average[name])


def test_state_loads_checks_its_keys_and_resets_to_the_weights():
    model = torch.nn.Linear(2, 2)
    ema = PolicyEMA(weights_of(model), decay=0.5)
    ema.load_state_dict({name: torch.full_like(v, 3.0) for name, v in weights_of(model).items()})
    assert all(bool((v == 3.0).all()) for v in ema.state_dict().values())
    ema.reset()
    assert all(torch.equal(ema.state_dict()[n], v) for n, v in weights_of(model).items())
    with pytest.raises(KeyError, match=r"missing \['bias'\]"):
        ema.load_state_dict({"weight": torch.zeros(2, 2)})


def test_under_fsdp2_each_rank_holds_and_updates_its_shard():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from sage_grpo.plan.simulate import fake_process_group

    with fake_process_group(2, rank=1):
        model = torch.nn.Linear(4, 6, bias=False)
        full = model.weight.detach().clone()
        fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
        ema = PolicyEMA(weights_of(model), decay=0.5)
        average, weight = ema.state_dict()["weight"], model.weight
        assert isinstance(average, DTensor) and average.placements == weight.placements
        assert average.device_mesh == weight.device_mesh and average.to_local().shape == (3, 4)
        assert torch.equal(average.to_local(), full[3:])  # rank 1's rows
        with torch.no_grad():
            weight.to_local().add_(2.0)
        ema.update()  # no collective: this rank's rows move half way to the new weights
        torch.testing.assert_close(average.to_local(), full[3:] + 1.0)


def test_generate_export_and_the_model_card_take_the_checkpoints_ema_folder(tmp_path):
    """checkpoint-N/ema/ is a weights location like checkpoint-N/transformer/ (generate.py --checkpoint_path, the
    export, the evaluation's --checkpoints), and the export's card says it is the EMA."""
    from safetensors.torch import save_file

    from sage_grpo.export.model_card import model_card
    from sage_grpo.export.weights import read_trained_weights

    checkpoint = tmp_path / "run" / "checkpoint-4"
    for folder, value in (("transformer", 1.0), ("ema", 0.5)):
        (checkpoint / folder).mkdir(parents=True)
        save_file({"proj.weight": torch.full((2, 2), value)}, str(checkpoint / folder / "model.safetensors"))
    (checkpoint / "config.yaml").write_text("ema_decay: 0.999\n")
    weights = read_trained_weights(checkpoint / "ema")
    assert weights.kind == "full" and weights.state["proj.weight"].tolist() == [[0.5, 0.5], [0.5, 0.5]]
    card = model_card(checkpoint / "ema", export_format="transformer", dtype="fp32", merged_lora=False)
    assert ("# A HunyuanVideo-1.5-class transformer, fully fine-tuned (the exponential moving average of the trained "
            "weights, --ema_decay `0.999`)") in card and "from `checkpoint-4` (step 4)" in card
