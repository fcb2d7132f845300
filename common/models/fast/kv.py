"""Speedup: decode steps write their keys and values in place, into buffers with room."""

import functools


def _append_in_place(cache, room):
    """Let each full-attention layer of a DynamicCache take a decode step's keys and values into
    buffers with `room` more positions, instead of concatenating a new copy of the whole cache every
    token: on a CPU that copy (tens of MB in fresh pages at 32 rows) cost more than the step's
    matmuls. Rows dropped by batch_select_indices get new buffers at the next step. (`--compile`'s
    StaticCache also writes in place, but attends over its whole length every step and keeps
    finished rows.)"""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # a transformers whose caches have no layer objects: concatenate
        return cache

    def update(layer, keys, values, *args, **kwargs):
        n, m = layer.keys.shape[-2], keys.shape[-2]
        buffers = getattr(layer, "buffers", None)
        # new buffers on the first step, after rows left (new key tensors), or when full
        if (buffers is None or layer.keys.data_ptr() != buffers[0].data_ptr()
                or n + m > buffers[0].shape[-2]):
            size = n + max(m, room)
            buffers = [x.new_empty(*x.shape[:-2], size, x.shape[-1]) for x in (keys, values)]
            buffers[0][..., :n, :] = layer.keys
            buffers[1][..., :n, :] = layer.values
            layer.buffers = buffers
        buffers[0][..., n:n + m, :] = keys
        buffers[1][..., n:n + m, :] = values
        layer.keys, layer.values = buffers[0][..., :n + m, :], buffers[1][..., :n + m, :]
        return layer.keys, layer.values

    for layer in getattr(cache, "layers", []):
        # written layers only (keys None before; 4.56's layers have no is_initialized); sliding
        # windows keep their own update
        if type(layer) is DynamicLayer and layer.keys is not None:
            layer.update = functools.partial(update, layer)
    return cache

