"""The quickstart's trial: a small PyTorch MLP on synthetic data, tuned by trialkit.

Reports validation accuracy after every epoch (the intermediate results an
assessor may judge) and at the end (the final result the tuner learns from).
Trains on the GPU where CUDA shows one (trialGpuNumber gives each trial its
own), else on the CPU. Runs by hand too: `python3 train.py` uses the defaults below.
"""
import torch
from torch import nn

import trialkit

EPOCHS = 8
FEATURES = 16


def synthetic_data(samples: int, seed: int):
    """Points labelled by a fixed random teacher network: learnable, not trivially."""
    teacher = torch.Generator().manual_seed(1234)
    w1, w2 = torch.randn(FEATURES, 32, generator=teacher), torch.randn(32, generator=teacher)
    x = torch.randn(samples, FEATURES, generator=torch.Generator().manual_seed(seed))
    y = (torch.tanh(x @ w1) @ w2 > 0).long()
    return x, y


def main() -> None:
    params = {"lr": 0.05, "momentum": 0.5, "hidden_size": 32, "batch_size": 64}
    params.update(trialkit.get_next_parameter())
    torch.manual_seed(0)
    torch.set_num_threads(1)  # trials run side by side: one core each
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"training on {device}", flush=True)
    x_train, y_train = (t.to(device) for t in synthetic_data(4000, seed=1))
    x_valid, y_valid = (t.to(device) for t in synthetic_data(1000, seed=2))
    model = nn.Sequential(nn.Linear(FEATURES, params["hidden_size"]), nn.ReLU(),
                          nn.Linear(params["hidden_size"], 2)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=params["momentum"])
    accuracy = 0.0
    for epoch in range(EPOCHS):
        model.train()
        for batch in torch.randperm(len(x_train)).split(params["batch_size"]):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x_train[batch]), y_train[batch]).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_valid).argmax(dim=1) == y_valid).float().mean().item()
        trialkit.report_intermediate_result(accuracy)
        # A stop (early stop, timeout, Ctrl-C) also comes as SIGTERM, which ends this script where it is:
        # it has nothing to save. A script with a checkpoint handles SIGTERM and saves here instead
        # (docs/sdk.md, "Stopping when asked").
        if trialkit.should_preempt():
            break
    trialkit.report_final_result(accuracy)


if __name__ == "__main__":
    main()
