"""torch, when it is installed: the base classes granary's datasets and sampler derive from
(``object`` without torch)."""

try:  # torch is optional
    import torch.utils.data as _tud

    _MapBase = _tud.Dataset
    _IterBase = _tud.IterableDataset
    _SamplerBase = _tud.Sampler
    try:
        # DataLoader workers seed numpy.random as they start, which numpy 2 imports lazily: a
        # worker forked while a thread of this process held that import's lock could not
        # import it (KeyError in importlib) and died. Imported here, it is already there.
        import numpy.random  # noqa: F401
    except ImportError:
        pass
except ImportError:  # pragma: no cover - exercised by the no-torch test run
    _tud = None
    _MapBase = object
    _IterBase = object
    _SamplerBase = object
