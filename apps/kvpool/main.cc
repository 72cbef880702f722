// The kvpool command.
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  std::fprintf(stderr, "usage: kvpool plan\n");
  return argc > 1 && std::strcmp(argv[1], "plan") == 0 ? 0 : 2;
}
