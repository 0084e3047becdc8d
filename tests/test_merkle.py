"""``auditlog.integrity.merkle`` against RFC 9162 / Certificate Transparency's published test vectors.

The vectors (leaves, tree heads of sizes 0..8, two audit paths and three
consistency proofs) are the ones Certificate Transparency's implementations
test against; a tree no other implementation agrees with proves nothing to
anyone else.
"""

from __future__ import annotations

import hashlib

import pytest

from auditlog.integrity import merkle as M

LEAVES = [
    bytes.fromhex(h)
    for h in [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
]
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
INCLUSION = {
    (0, 8): [
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ],
    (5, 8): [
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    ],
}
CONSISTENCY = {
    (2, 8): [
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ],
    (6, 8): [
        "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    ],
    (2, 5): [
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
    ],
}
HASHED = [M.leaf_hash(d) for d in LEAVES]


def mth(data: list[bytes]) -> bytes:
    """RFC 9162 section 2.1.1, written out recursively as the RFC states it."""
    if not data:
        return hashlib.sha256(b"").digest()
    if len(data) == 1:
        return hashlib.sha256(b"\x00" + data[0]).digest()
    k = 1
    while k * 2 < len(data):
        k *= 2
    return hashlib.sha256(b"\x01" + mth(data[:k]) + mth(data[k:])).digest()


def test_tree_heads_match_the_published_roots_and_the_rfc_definition() -> None:
    frontier = M.Frontier()
    assert frontier.root().hex() == ROOTS[0] == M.root(HASHED, 0).hex()
    for n in range(1, 9):
        frontier.append(HASHED[n - 1])
        assert M.root(HASHED, n).hex() == ROOTS[n]
        assert frontier.root().hex() == ROOTS[n]
        assert mth(LEAVES[:n]).hex() == ROOTS[n]


def test_the_split_is_the_largest_power_of_two_below_n_not_the_midpoint() -> None:
    assert [M.split_point(n) for n in (2, 3, 4, 5, 6, 7, 8, 9, 1000)] == [
        1,
        2,
        2,
        4,
        4,
        4,
        4,
        8,
        512,
    ]


@pytest.mark.parametrize("index, size", sorted(INCLUSION))
def test_audit_paths_match_the_published_vectors(index: int, size: int) -> None:
    path = M.inclusion_proof(HASHED, index, size)
    assert [p.hex() for p in path] == INCLUSION[(index, size)]
    assert M.verify_inclusion(index, size, HASHED[index], path, bytes.fromhex(ROOTS[size]))


@pytest.mark.parametrize("old, new", sorted(CONSISTENCY))
def test_consistency_proofs_match_the_published_vectors(old: int, new: int) -> None:
    proof = M.consistency_proof(HASHED, old, new)
    assert [p.hex() for p in proof] == CONSISTENCY[(old, new)]
    assert M.verify_consistency(
        old, new, bytes.fromhex(ROOTS[old]), bytes.fromhex(ROOTS[new]), proof
    )


def test_every_proof_of_every_small_tree_verifies_and_no_mangled_one_does() -> None:
    leaves = [M.leaf_hash(bytes([i, i * 7 % 256])) for i in range(40)]
    packed = M.PackedLeaves()
    for leaf in leaves:
        packed.append(leaf)
    for n in range(0, 41):
        head = M.root(leaves, n)
        assert M.root(packed, n) == head == mth([bytes([i, i * 7 % 256]) for i in range(n)])
        for i in range(n):
            path = M.inclusion_proof(packed, i, n)
            assert M.verify_inclusion(i, n, leaves[i], path, head)
            assert not M.verify_inclusion(i, n, leaves[(i + 1) % n], path, head) or n == 1
            if path:
                flipped = [*path[:-1], bytes([path[-1][0] ^ 1]) + path[-1][1:]]
                assert not M.verify_inclusion(i, n, leaves[i], flipped, head)
                assert not M.verify_inclusion(i, n, leaves[i], path[:-1], head)
                assert not M.verify_inclusion(i, n, leaves[i], [*path, path[0]], head)
            if n > 1:
                assert (
                    not M.verify_inclusion((i + 1) % n, n, leaves[i], path, head)
                    or leaves[i] == leaves[(i + 1) % n]
                )
        for m in range(0, n + 1):
            proof = M.consistency_proof(leaves, m, n)
            assert M.verify_consistency(m, n, M.root(leaves, m), head, proof)
            if proof and 0 < m < n:
                assert not M.verify_consistency(m, n, M.root(leaves, m), head, proof[:-1])
                bad = [bytes([proof[0][0] ^ 0x80]) + proof[0][1:], *proof[1:]]
                assert not M.verify_consistency(m, n, M.root(leaves, m), head, bad)
                other = [M.leaf_hash(b"x"), *leaves[1:m]]
                assert not M.verify_consistency(m, n, M.root(other, m), head, proof)


def test_degenerate_and_malformed_inputs_are_refused() -> None:
    root8 = bytes.fromhex(ROOTS[8])
    path = M.inclusion_proof(HASHED, 5, 8)
    assert not M.verify_inclusion(8, 8, HASHED[5], path, root8)
    assert not M.verify_inclusion(-1, 8, HASHED[5], path, root8)
    assert not M.verify_inclusion(5, 8, HASHED[5][:31], path, root8)
    assert M.verify_consistency(4, 4, bytes.fromhex(ROOTS[4]), bytes.fromhex(ROOTS[4]), [])
    assert not M.verify_consistency(4, 4, bytes.fromhex(ROOTS[4]), bytes.fromhex(ROOTS[5]), [])
    assert M.verify_consistency(0, 8, M.EMPTY_ROOT, root8, [])
    assert not M.verify_consistency(6, 8, bytes.fromhex(ROOTS[6]), root8, [])
    assert not M.verify_consistency(8, 6, root8, bytes.fromhex(ROOTS[6]), [])
    with pytest.raises(ValueError):
        M.inclusion_proof(HASHED, 8, 8)
    with pytest.raises(ValueError):
        M.consistency_proof(HASHED, 5, 3)
