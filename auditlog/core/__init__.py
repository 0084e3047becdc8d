"""Core: what every layer shares and nothing else defines.

Event kinds, the capture policy, canonical encoding and the hash chain, tensor
hashing and statistics, replay of construction into a module tree, naming,
process liveness, and the one exception hierarchy. Nothing here touches a store,
a hook or a terminal; only ``tensors`` imports torch.
"""
