/*
 * exec-shim PROGRAM ARGV0 [ARG...]: execve PROGRAM with ARGV0 and ARGs, after setting
 * glibc's two internal signals (32 and 33) back to their default.
 *
 * The agent starts commands with os.posix_spawn (every other signal at its default, none
 * blocked, a new session). glibc's posix_spawn leaves those two ignored in the child, and
 * ignored dispositions survive exec, so a program that is not glibc's (Go, musl, a JIT)
 * would start with them ignored. sigaction() refuses them; the raw system call does not.
 * Without this program the agent would have to load ctypes to call libc's posix_spawn
 * itself, which cost each jail's start about 3 ms of CPU.
 *
 * Built static by the local provider (sandboxes/providers/local/c_helpers.py), so it runs
 * in any template's root file system.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

/* Room for the kernel's struct sigaction (32 bytes on x86-64); all zeros is SIG_DFL. */
#define KERNEL_SIGACTION_BYTES 64
#define KERNEL_SIGSET_BYTES 8L

int main(int argc, char **argv) {
    if (argc < 3) {
        fputs("usage: exec-shim PROGRAM ARGV0 [ARG...]\n", stderr);
        return 2;
    }
    static const unsigned char default_action[KERNEL_SIGACTION_BYTES];
    for (long sig = 32; sig <= 33; sig++) {
        syscall(SYS_rt_sigaction, sig, default_action, NULL, KERNEL_SIGSET_BYTES);
    }
    execve(argv[1], argv + 2, environ);
    /* Reported like the agent's fork path reports it: the shell's "cannot run" status. */
    fprintf(stderr, "sandpit: %s: %s\n", argv[2], strerror(errno));
    return 127;
}
