"""torch.cuda as far as the NCCL check uses it: a device to select, nothing to wait for."""

current = 0


def set_device(device: int) -> None:
    global current
    current = int(device)


def synchronize() -> None:
    """The stand-in's collectives are done when they return."""
