# Medians of model_cpu_bench's decode ms/step per binary over the rounds in the given folders:
#   python3 summarise_model.py NAME_A NAME_B FOLDER...
import glob, statistics, sys

a, b = sys.argv[1], sys.argv[2]
vals = {a: [], b: []}
floors = []
for folder in sys.argv[3:]:
    for name in (a, b):
        for i in range(1, 100):
            try:
                lines = open(f"{folder}/{name}.{i}.txt").read().splitlines()
            except FileNotFoundError:
                break
            for line in lines:
                t = line.split()
                if t and t[0] == "decode" and t[1] == "1":
                    vals[name].append(float(t[3]))
                    floors.append(float(t[5]))
for name in (a, b):
    v = vals[name]
    print(f"{name}: median {statistics.median(v):.2f} ms/step, min {min(v):.2f}, n {len(v)}: "
          + " ".join(f"{x:.2f}" for x in v))
pairs = list(zip(vals[a], vals[b]))
print(f"{b}/{a} of medians {statistics.median(vals[b]) / statistics.median(vals[a]):.3f}; "
      f"pair by pair median {statistics.median(y / x for x, y in pairs):.3f}, "
      f"{b} faster in {sum(y < x for x, y in pairs)} of {len(pairs)}; floor ms median "
      f"{statistics.median(floors):.2f}")
