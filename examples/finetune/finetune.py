"""Preemptible fine-tune: the script of the "Preemptible fine-tuning with checkpoints" recipe.

Online (the default): ImageNet-trained ResNet-50 fine-tuned on CIFAR-100, exactly as on the page
(needs torchvision, a CIFAR-100 download and the ImageNet weights; a GPU if there is one).

Offline (ASTRAEUS_OFFLINE=1): no torchvision, no download. CIFAR-shaped synthetic data generated
locally (seeded, so every attempt sees the same data) and a small randomly initialised CNN. The
checkpoint, SIGTERM and resume logic and the log lines are the same. Offline knobs:
  OFFLINE_SAMPLES (4096)  OFFLINE_IMAGE_SIZE (32)  OFFLINE_SEED (0)  BATCH_SIZE (32 offline)
  STEP_SLEEP (0; seconds to sleep after each step, for a steady, watchable demo)
  NUM_WORKERS (6 on cuda online, else 0)
"""
import json
import os
import signal
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Subset

OFFLINE = os.environ.get("ASTRAEUS_OFFLINE", "") == "1"
if not OFFLINE:  # torchvision only where it is used: offline mode never imports it
    import torchvision
    import torchvision.transforms as T

CKPT_DIR = os.environ.get("CKPT_DIR", "/ckpt")
EPOCHS = int(os.environ.get("EPOCHS", "20"))
BATCH = int(os.environ.get("BATCH_SIZE", "32" if OFFLINE else "128"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "200"))  # steps
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0"))  # seconds after each step (demo pacing)
RUN = os.environ.get("ASTRAEUS_JOB_NAME", "local").rsplit(".", 1)[-1]
run_dir = os.path.join(CKPT_DIR, RUN)
os.makedirs(run_dir, exist_ok=True)
ckpt_path = os.path.join(run_dir, "ckpt.pt")

stop_requested = False


def on_sigterm(signum, frame):
    global stop_requested
    stop_requested = True
    print("SIGTERM: saving a checkpoint after this step", flush=True)


signal.signal(signal.SIGTERM, on_sigterm)

device = "cuda" if torch.cuda.is_available() else "cpu"
WORKERS = int(os.environ.get("NUM_WORKERS", "6" if device == "cuda" and not OFFLINE else "0"))

# ---------------------------------------------------------------------------------------------
# OFFLINE MODE (ASTRAEUS_OFFLINE=1): synthetic CIFAR-shaped data and a small CNN, no download.
# ---------------------------------------------------------------------------------------------
if OFFLINE:
    torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "1")))
    torch.manual_seed(int(os.environ.get("OFFLINE_SEED", "0")))

    def synthetic_cifar(n, size, classes=100, seed=0):
        """n images of 3 x size x size in `classes` classes: a fixed low-frequency pattern per class,
        plus noise, normalised like the online transform's output. Same seed, same data."""
        g = torch.Generator().manual_seed(seed)
        protos = torch.randn(classes, 3, 4, 4, generator=g)
        protos = nn.functional.interpolate(protos, size=(size, size), mode="bilinear", align_corners=False)
        labels = torch.randint(0, classes, (n,), generator=g)
        images = protos[labels] + 0.8 * torch.randn(n, 3, size, size, generator=g)
        return torch.utils.data.TensorDataset(images, labels)

    class SmallCNN(nn.Module):
        def __init__(self, classes=1000):
            super().__init__()

            def block(cin, cout):
                return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                     nn.ReLU(inplace=True))

            self.features = nn.Sequential(block(3, 32), nn.MaxPool2d(2), block(32, 64), nn.MaxPool2d(2),
                                          block(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.fc = nn.Linear(128, classes)  # replaced below, as the ResNet's is

        def forward(self, x):
            return self.fc(self.features(x))
# --------------------------------------------------------------------------- end OFFLINE MODE

if OFFLINE:
    train = synthetic_cifar(int(os.environ.get("OFFLINE_SAMPLES", "4096")),
                            int(os.environ.get("OFFLINE_IMAGE_SIZE", "32")),
                            seed=int(os.environ.get("OFFLINE_SEED", "0")))
else:
    tf = T.Compose([T.Resize(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    train = torchvision.datasets.CIFAR100(os.path.join(CKPT_DIR, "data"), train=True, download=True, transform=tf)
steps_per_epoch = len(train) // BATCH

if OFFLINE:
    model = SmallCNN()
else:
    model = torchvision.models.resnet50(weights="IMAGENET1K_V2")
model.fc = nn.Linear(model.fc.in_features, 100)
model = model.to(device, memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS * steps_per_epoch)
loss_fn = nn.CrossEntropyLoss()

start_epoch, start_step, global_step = 0, 0, 0
if os.path.exists(ckpt_path):
    ck = torch.load(ckpt_path, map_location=device)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    sched.load_state_dict(ck["sched"])
    start_epoch, start_step, global_step = ck["epoch"], ck["step"], ck["global_step"]
    print(f"resuming at epoch {start_epoch + 1}, step {start_step} (global step {global_step})", flush=True)


def save(epoch, step):
    tmp = ckpt_path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                "epoch": epoch, "step": step, "global_step": global_step}, tmp)
    os.replace(tmp, ckpt_path)  # atomic: the old checkpoint stays whole until here
    if os.environ.get("ASTRAEUS_CHECKPOINT_FILE"):  # tells Astraeus when the last checkpoint was saved
        with open(os.environ["ASTRAEUS_CHECKPOINT_FILE"], "w") as f:
            f.write(f"global step {global_step}\n")


for epoch in range(start_epoch, EPOCHS):
    # The same order every time this epoch is run, so a resumed epoch can
    # skip exactly the batches already seen.
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(epoch)).tolist()
    skip = start_step if epoch == start_epoch else 0
    dl = DataLoader(Subset(train, order[skip * BATCH:]), BATCH, num_workers=WORKERS, pin_memory=device == "cuda",
                    drop_last=True)
    model.train()
    for i, (x, y) in enumerate(dl, start=skip):
        x = x.to(device, non_blocking=True, memory_format=torch.channels_last)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):  # no bf16 autocast on cpu
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        global_step += 1
        if STEP_SLEEP:
            time.sleep(STEP_SLEEP)
        if stop_requested:
            t0 = time.time()
            save(epoch, i + 1)
            print(f"checkpoint at global step {global_step} written in {time.time() - t0:.1f}s; exiting", flush=True)
            sys.exit(0)
        if global_step % SAVE_EVERY == 0:
            save(epoch, i + 1)
            print(json.dumps({"epoch": epoch + 1, "global_step": global_step, "loss": round(loss.item(), 4)}), flush=True)
    save(epoch + 1, 0)

torch.save(model.state_dict(), os.path.join(run_dir, "model.pt"))
print("done", flush=True)
