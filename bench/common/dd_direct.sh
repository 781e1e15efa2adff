# dd's direct-I/O bandwidth on a directory, the reference of the swap-file benchmarks
# (bench/aio/run.sh, bench/offload/run.sh). Source it, then:
#   dd_direct DIR MIB      writes and reads a MIB-MiB file in DIR three times:
#                            dd if=/dev/zero of=F bs=1M count=MIB oflag=direct   (write)
#                            dd if=F of=/dev/null bs=1M iflag=direct             (read)
#                          prints each repeat, then sets DD_WRITE_GBS and DD_READ_GBS to the
#                          medians (GB/s, 10^9 bytes/s); the file is removed.

# GB/s from dd's "N bytes (...) copied, S s, ..." line.
_dd_gbs() { sed -n 's/^\([0-9]*\) bytes.* copied, \([0-9.e+-]*\) s.*/\1 \2/p' | awk '{printf "%.3f\n", $1 / $2 / 1e9}'; }
_dd_median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

dd_direct() {
  local dir=$1 mib=$2 f w=() r=() i
  f=$dir/dd_direct.$$
  for i in 1 2 3; do
    w+=("$(dd if=/dev/zero of="$f" bs=1M count="$mib" oflag=direct 2>&1 | _dd_gbs)")
    r+=("$(dd if="$f" of=/dev/null bs=1M iflag=direct 2>&1 | _dd_gbs)")
    echo "dd repeat=$i write_gbs=${w[-1]} read_gbs=${r[-1]}"
  done
  rm -f "$f"
  DD_WRITE_GBS=$(printf '%s\n' "${w[@]}" | _dd_median)
  DD_READ_GBS=$(printf '%s\n' "${r[@]}" | _dd_median)
  echo "dd write_gbs=$DD_WRITE_GBS read_gbs=$DD_READ_GBS (medians of 3; $mib MiB, bs=1M, O_DIRECT)"
}
