// CRC-32C (Castagnoli, the iSCSI / ext4 / RFC 3720 polynomial 0x1EDC6F41, reflected) over raw
// bytes: the checksum of every dataset in a checkpoint manifest.
//
// crc32c_ref is the plain table version (obviously right); crc32c uses the SSE4.2 crc32
// instruction when the CPU has it (about 10x faster) and the table otherwise. Both give the
// standard value: crc32c("123456789") == 0xE3069283. Incremental: pass the previous value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ds::io {

std::uint32_t crc32c_ref(const void* data, std::size_t bytes, std::uint32_t crc = 0);
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0);

}  // namespace ds::io
