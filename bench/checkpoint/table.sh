#!/bin/bash
# Markdown table from run.sh's raw lines ("<what> <bytes> <seconds> <GB/s>", one block per
# repeat): medians of the rates, and the median of the per-repeat ratios (each repeat ran
# dd, dstrain and torch back to back, so its ratios share the disk's load of the moment).
# Other lines (bench_checkpoint's verdict and JSON: record) are skipped.
# usage: table.sh RAW N
awk -v n="$2" '
  function med(k,   i, j, t, c) { c = cnt[k]; for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[k, j] < v[k, i]) { t = v[k, i]; v[k, i] = v[k, j]; v[k, j] = t } return v[k, int((c + 1) / 2)] }
  function add(k, x) { cnt[k]++; v[k, cnt[k]] = x }
  /^(dd|dstrain|torch)_/ { r = ++seen[$1]; g[$1, r] = $4; add($1, $4); if (r > reps) reps = r }
  END {
    for (r = 1; r <= reps; r++) {
      add("sd", g["dstrain_save", r] / g["dd_write", r]); add("st", g["dstrain_save", r] / g["torch_save", r])
      add("ld", g["dstrain_load", r] / g["dd_read", r]); add("lt", g["dstrain_load", r] / g["torch_load", r])
      add("vd", g["dstrain_load_verified", r] / g["dd_read", r]); add("vt", g["dstrain_load_verified", r] / g["torch_load", r])
    }
    printf "%d parameters, %.2f GB per checkpoint (bf16 params + fp32 master + Adam exp_avg, exp_avg_sq); %d interleaved repeats; rates are medians, ratios the median of the per-repeat ratios\n\n", n, n*14/1e9, reps
    print "| operation | dstrain GB/s | dd GB/s | torch GB/s | dstrain / dd | dstrain / torch |"
    print "| --- | --- | --- | --- | --- | --- |"
    printf "| save (fsync) | %.3f | %.3f (write, conv=fdatasync) | %.3f (torch.save + fsync) | %.0f%% | %.2fx |\n", med("dstrain_save"), med("dd_write"), med("torch_save"), 100*med("sd"), med("st")
    printf "| load into existing buffers | %.3f | %.3f (read) | %.3f (torch.load) | %.0f%% | %.2fx |\n", med("dstrain_load"), med("dd_read"), med("torch_load"), 100*med("ld"), med("lt")
    printf "| load + CRC-32C verification | %.3f | %.3f (read) | %.3f (torch.load) | %.0f%% | %.2fx |\n", med("dstrain_load_verified"), med("dd_read"), med("torch_load"), 100*med("vd"), med("vt")
  }' "$1"
