"""TensorBoard event files from ds::io::EventWriter, read back with a reader of our own (TFRecord
framing with its masked CRC-32C, protobuf wire format decoded by hand): every CRC, the version
event, and each scalar's tag, value and step. usage: tfevents_check.py DRIVER"""
import os
import subprocess
import sys
import tempfile

from tfevents_reader import crc32c, scalars


def main():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([sys.argv[1], os.path.join(d, "tb", "job"), "5"], check=True,
                             capture_output=True, text=True).stdout.strip()
        name = os.path.basename(out)
        assert name.startswith("events.out.tfevents."), name
        got = scalars(out)
    want = []
    for s in range(1, 6):
        want += [(s * 8, "Train/Samples/train_loss", 4.0 - 0.25 * s), (s * 8, "Train/Samples/lr", 0.001953125 * s)]
    assert got == want, got
    print("tfevents: %d scalars, CRCs and values as written" % len(got))


main()
