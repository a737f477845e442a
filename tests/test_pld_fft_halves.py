"""The radix-2 step between a real FFT and the transforms of its even and odd samples
(``cpp/src/fft_halves.cpp``), and the accountant's transforms that use it from
``_pld_numerics._SPLIT_FROM`` points on: checked against pocketfft's own transform of the whole
length (an independent implementation), and for the same bits from one or two threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.fft

from dpsharp._native import core
from dpsharp.accountants import _pld_numerics

SIZES = [4, 8, 12, 20, 1 << 10, 9 << 8, 15 << 10, 1 << 16]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("threads", [1, 2])
def test_combine_halves_is_the_whole_transform(size: int, threads: int) -> None:
    x = np.random.default_rng(size).standard_normal(size)
    expected = scipy.fft.rfft(x)
    combined = core.fft_combine_halves(scipy.fft.rfft(x[0::2]), scipy.fft.rfft(x[1::2]), size, threads)
    assert combined.shape == expected.shape
    # FFT round-off: a few ulp of the largest entry per butterfly level.
    scale = np.max(np.abs(expected))
    assert np.max(np.abs(combined - expected)) <= 8 * np.log2(size) * 2.0**-52 * scale


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("threads", [1, 2])
def test_split_spectrum_inverts_the_whole_transform(size: int, threads: int) -> None:
    rng = np.random.default_rng(size + 1)
    spectrum = rng.standard_normal(size // 2 + 1) + 1j * rng.standard_normal(size // 2 + 1)
    expected = scipy.fft.irfft(spectrum, n=size)  # ignores the imaginary parts at 0 and size / 2
    even, odd = core.fft_split_spectrum(spectrum, size, threads)
    samples = np.empty(size)
    samples[0::2] = scipy.fft.irfft(even, n=size // 2)
    samples[1::2] = scipy.fft.irfft(odd, n=size // 2)
    scale = np.max(np.abs(spectrum)) * np.sqrt(size) / size
    assert np.max(np.abs(samples - expected)) <= 8 * np.log2(size) * 2.0**-52 * max(scale, np.max(np.abs(expected)))


def test_threads_give_the_same_bits() -> None:
    size = 9 << 14  # 2^17 + 2^14 entries: both threads take part (2^15 entries per thread at least)
    x = np.random.default_rng(7).standard_normal(size)
    even, odd = scipy.fft.rfft(x[0::2]), scipy.fft.rfft(x[1::2])
    np.testing.assert_array_equal(
        core.fft_combine_halves(even, odd, size, 1), core.fft_combine_halves(even, odd, size, 2)
    )
    spectrum = scipy.fft.rfft(x)
    for one, two in zip(core.fft_split_spectrum(spectrum, size, 1), core.fft_split_spectrum(spectrum, size, 2)):
        np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: core.fft_combine_halves(np.zeros(2), np.zeros(2), 6, 1), "multiple of 4"),
        (lambda: core.fft_combine_halves(np.zeros(3), np.zeros(3), 8, 0), "threads"),
        (lambda: core.fft_combine_halves(np.zeros(3), np.zeros(2), 8, 1), "odd must be"),
        (lambda: core.fft_combine_halves(np.zeros((3, 1)), np.zeros(3), 8, 1), "even must be"),
        (lambda: core.fft_split_spectrum(np.zeros(4), 8, 1), "spectrum must be"),
        (lambda: core.fft_split_spectrum(np.zeros(1), 0, 1), "multiple of 4"),
    ],
)
def test_bad_input_is_refused(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


def test_accountant_transforms_match_pocketfft_and_do_not_depend_on_the_thread() -> None:
    """From _SPLIT_FROM points on, forward_transform / inverse_transform go through the halves
    (on two threads from the main thread, one after the other on a pool thread): the same
    values as pocketfft's whole-length transforms up to round-off, the same bits either way."""
    size = 3 * _pld_numerics._SPLIT_FROM
    x = np.random.default_rng(3).random(size)
    forward = _pld_numerics.forward_transform(x, size)
    scale = np.max(np.abs(forward))
    assert np.max(np.abs(forward - scipy.fft.rfft(x))) <= 1e-14 * scale
    back = _pld_numerics.inverse_transform(forward, size)
    assert np.max(np.abs(back - x)) <= 1e-14
    pool_results: list[np.ndarray] = []

    def on_pool_thread() -> None:
        assert _pld_numerics.threads_for_caller() == 1
        pool_results.extend(
            [_pld_numerics.forward_transform(x, size), _pld_numerics.inverse_transform(forward, size)]
        )

    thread = threading.Thread(target=on_pool_thread, name=_pld_numerics._POOL_PREFIX + "-test")
    thread.start()
    thread.join()
    np.testing.assert_array_equal(pool_results[0], forward)
    np.testing.assert_array_equal(pool_results[1], back)
    # Below the threshold (and for sizes not divisible by 4): pocketfft's transform, bit for bit.
    small = x[: _pld_numerics._SPLIT_FROM - 4]
    np.testing.assert_array_equal(_pld_numerics.forward_transform(small, small.size), scipy.fft.rfft(small))
