cuda = None  # the stand-in has no CUDA (torch.version.cuda is None on a CPU build too)
