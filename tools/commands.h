/* The kiln command line's subcommands: each takes its own argv (argv[0] is the subcommand's
 * name) and returns the process exit status (0 done, 1 refused input, 2 usage error). */
#ifndef KILN_TOOLS_COMMANDS_H
#define KILN_TOOLS_COMMANDS_H

int kiln_cmd_inspect(int argc, char **argv);
int kiln_cmd_demo_blob(int argc, char **argv);
int kiln_cmd_audit(int argc, char **argv);
int kiln_cmd_profile(int argc, char **argv);

#endif
