// CRC-32C (Castagnoli, the iSCSI / ext4 / RFC 3720 polynomial 0x1EDC6F41, reflected) over raw
// bytes: the checksum of every dataset in a checkpoint manifest.
//
// crc32c_ref is the plain table version (obviously right). crc32c picks the fastest the CPU
// has: crc32c_fold (carry-less multiplication folding on 512-bit registers, AVX-512 +
// VPCLMULQDQ, for 256 bytes or more: memory speed), else crc32c_streams (the CRC-32C
// instruction, SSE4.2's crc32 on x86-64 or ARMv8's crc32c* on aarch64, on three interleaved
// streams, ~3x the single-stream loop), else the table.
// The debug variable DS_CRC32C_NO_AVX512=1 (ds/core/env.h) keeps crc32c off the folding path.
// All give the standard value: crc32c("123456789") == 0xE3069283. Incremental: pass the
// previous value. crc32c_fold and crc32c_streams are public so that tests compare each
// with crc32c_ref; each falls back to the next when the CPU lacks its instructions.
//
// crc32c_combine joins the checksums of two adjacent pieces A and B (B of bytes_b bytes) into
// the checksum of A followed by B, so pieces can be summed on different threads:
//   crc32c(A ++ B) == crc32c_combine(crc32c(A), crc32c(B), |B|).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ds::io {

std::uint32_t crc32c_ref(const void* data, std::size_t bytes, std::uint32_t crc = 0);
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0);
std::uint32_t crc32c_fold(const void* data, std::size_t bytes, std::uint32_t crc = 0);
std::uint32_t crc32c_streams(const void* data, std::size_t bytes, std::uint32_t crc = 0);
bool crc32c_fold_available();     // the CPU has AVX-512F + VPCLMULQDQ
bool crc32c_streams_available();  // the CPU has the CRC-32C instruction (SSE4.2, ARMv8 CRC32)
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t bytes_b);

}  // namespace ds::io
