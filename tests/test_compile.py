"""torch.compile over training steps of varying target lengths: the model makes no more graphs than a MarianMTModel
of the same size (+1 at most) and never reaches torch's recompile limit, with and without label smoothing and with
the loss without logits, at batch sizes that are not multiples of 16; the loss without logits is one opaque op in
the graph, with the eager loss and gradients, also when AOTAutograd traces its backward."""

import pytest
import torch
import torch._dynamo
from conftest import tiny_marian, tiny_model

from vanilla_transformer import loss_vanilla_transformer

SIZE = dict(encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2)
LENGTHS = range(2, 14)  # target lengths of the steps; each step's source has 7 tokens


def batches(batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    steps = []
    for length in LENGTHS:
        ids = torch.randint(4, 64, (batch_size, 7), generator=generator)
        labels = torch.randint(4, 64, (batch_size, length), generator=generator)
        labels[0, length // 2 :] = -100  # a shorter target, padded
        steps.append((ids, labels))
    return steps


def compiled_graphs(model, steps, **kwargs) -> list[torch.fx.GraphModule]:
    """The graphs dynamo makes while ``torch.compile(model)`` trains over the steps (forward + backward each);
    reaching the recompile limit fails instead of falling back to eager, as it otherwise does silently."""
    torch._dynamo.reset()
    graphs = []

    def keep(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward  # run as traced: the "eager" backend, counting

    compiled = torch.compile(model.train(), backend=keep)
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for ids, labels in steps:
            compiled(input_ids=ids, labels=labels, **kwargs).loss.backward()
    return graphs


def loss_op():
    """The op of the loss without logits, as it appears in a graph."""
    namespace, name = loss_vanilla_transformer._OP_NAME.split("::")
    return getattr(getattr(torch.ops, namespace), name).default


# the graphs torch.compile makes of MarianMTModel over the same steps (the first shapes, then dynamic ones), which
# test_marian_compiles_this_many_graphs measures beside ours
MARIAN_GRAPHS = 2
TRAINER_STEPS = [  # the model's keyword arguments in a training step of the project's trainer: on a GPU, on a CPU
    pytest.param({"label_smoothing": 0.1}, id="smoothed", marks=pytest.mark.slow),
    pytest.param({"label_smoothing": 0.1, "skip_logits": True}, id="smoothed-without-logits"),
]


@pytest.mark.parametrize("kwargs", TRAINER_STEPS)
def test_training_over_varying_lengths_compiles_as_few_graphs_as_marian(kwargs):
    graphs = compiled_graphs(tiny_model(**SIZE), batches(3), **kwargs)
    assert len(graphs) <= MARIAN_GRAPHS + 1
    calls = sum([node.target for node in graph.graph.nodes].count(loss_op()) for graph in graphs)
    assert calls == (len(graphs) if kwargs.get("skip_logits") else 0)  # once per graph, on the CPU's path


@pytest.mark.slow
def test_marian_compiles_this_many_graphs_and_ours_as_many_in_other_settings():
    """Beside a MarianMTModel of the same size: ours without label smoothing too, and at a batch size that is not a
    multiple of 16 (the old loss recompiled on (batch × length) % 16; batch 3 above is one too)."""
    marian = tiny_marian(**SIZE)
    assert len(compiled_graphs(marian, batches(3))) == MARIAN_GRAPHS
    settings = [({}, 3), ({"skip_logits": True}, 3), ({"label_smoothing": 0.1, "skip_logits": True}, 5)]
    for kwargs, batch_size in settings:
        graphs = compiled_graphs(tiny_model(**SIZE), batches(batch_size), **kwargs)
        assert len(graphs) <= MARIAN_GRAPHS + 1, (kwargs, batch_size)


@pytest.mark.slow
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_loss_without_logits_traces_into_one_graph_with_its_backward(autocast):
    """With AOTAutograd (what inductor compiles) and fullgraph=True: the op's backward is traced too, no graph breaks,
    and the compiled step's loss and gradients are the eager ones, in float32 and under bf16 autocast."""
    model = tiny_model(**SIZE, dropout=0.0)
    steps = batches(3)[1:2]
    grads = []
    for compile_it in (False, True):
        model.zero_grad()
        forward = torch.compile(model.train(), backend="aot_eager", fullgraph=True) if compile_it else model
        torch._dynamo.reset()
        losses = []
        for ids, labels in steps:
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                loss = forward(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True).loss
            loss.backward()
            losses.append(loss.detach())
        grads.append((losses, [p.grad.clone() for p in model.parameters()]))
    (eager_losses, eager_grads), (compiled_losses, compiled_grads) = grads
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-5, atol=0)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
