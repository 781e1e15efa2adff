"""A TensorBoard event-file reader of the tests' own, independent of dstrain's writer: TFRecord
framing with its masked CRC-32C checked, the protobuf wire format decoded by hand."""
import struct

from crc32c_ref import crc32c


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(blob):
    pos = 0
    while pos < len(blob):
        (length,) = struct.unpack_from("<Q", blob, pos)
        (len_crc,) = struct.unpack_from("<I", blob, pos + 8)
        assert len_crc == masked(blob[pos:pos + 8]), "length CRC at %d" % pos
        data = blob[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack_from("<I", blob, pos + 12 + length)
        assert data_crc == masked(data), "data CRC at %d" % pos
        yield data
        pos += 16 + length
    assert pos == len(blob), "trailing bytes"


def varint(buf, pos):
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def fields(buf):
    pos, out = 0, []
    while pos < len(buf):
        key, pos = varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        elif wire == 2:
            n, pos = varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        else:
            raise AssertionError("wire type %d" % wire)
        out.append((field, value))
    return out


def scalars(path):
    """[(step, tag, value)] of the event file at path; asserts the version event comes first."""
    events = [dict(fields(r)) for r in records(open(path, "rb").read())]
    assert events and events[0][3] == b"brain.Event:2", events[:1]
    out = []
    for e in events[1:]:
        assert struct.unpack("<d", e[1])[0] > 1.6e9  # wall time
        value = dict(fields(dict(fields(e[5]))[1]))
        out.append((e[2], value[1].decode(), struct.unpack("<f", value[2])[0]))
    return out
