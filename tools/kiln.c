/* kiln: the command line. Dispatches to one subcommand per file (cmd_*.c). */
#include "commands.h"

#include "kiln/kiln.h"

#include <stdio.h>
#include <string.h>

/* Stand-ins so the tool links when a subcommand's file is not part of the build. */
__attribute__((weak)) int kiln_cmd_demo_blob(int argc, char **argv) {
  fprintf(stderr, "kiln demo-blob: not built into this kiln\n");
  return 2;
}

__attribute__((weak)) int kiln_cmd_audit(int argc, char **argv) {
  fprintf(stderr, "kiln audit: not built into this kiln\n");
  return 2;
}

typedef struct command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *usage;
} command;

static const command commands[] = {
    {"inspect", kiln_cmd_inspect,
     "inspect FILE       print a Kiln blob, or the delegates of an ExecuTorch .pte"},
    {"demo-blob", kiln_cmd_demo_blob, "demo-blob PATH     write a small demonstration blob"},
    {"audit", kiln_cmd_audit, "audit ...          check a built delegate library or wheel"},
    {"profile", kiln_cmd_profile, "profile FILE       time each op of a blob or .pte's Kiln blobs on the GPU"},
};

static void usage(FILE *to) {
  fprintf(to, "kiln %s: Kiln's command line\nusage: kiln COMMAND [ARGS]\n", KILN_VERSION_STRING);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(to, "  kiln %s\n", commands[i].usage);
  fprintf(to, "  kiln --help             print this help\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
      strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
  }
  fprintf(stderr, "kiln: unknown command \"%.64s\": run kiln --help for the commands\n", argv[1]);
  return 2;
}
