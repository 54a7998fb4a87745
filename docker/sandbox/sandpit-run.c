/*
 * sandpit-run: runs one command in a Docker sandbox for the docker provider
 * (sandboxes/providers/docker.py), started by an Engine exec per command.
 *
 * Written in C because it starts in about a millisecond: the Python wrapper it
 * replaces cost ~13 ms of interpreter start-up on every command. Compiled
 * statically on the host by scripts/build-sandbox-image.sh (the image has no
 * compiler) and installed as /usr/local/lib/sandpit/run-v1; the "v1" is the
 * protocol below, so a provider never talks to a runner it does not understand.
 *
 * Usage: run-v1 NONCE TIMEOUT_S CAP CWD WANT_STDIN CODE_LEN CODE_SUFFIX ARGV...
 *
 * It starts ARGV in its own session with SANDPIT_EXEC=NONCE in its environment
 * (and without SANDPIT_INTERNAL, so the user's processes are listed), forwards
 * stdin (after the first CODE_LEN bytes, which are written to a file that
 * replaces any "{file}" argument), copies at most CAP bytes of each output
 * stream, kills the process group and every process carrying the nonce when
 * TIMEOUT_S passes, and ends stderr with a trailer:
 *
 *   \0NONCE:R EXIT TIMED_OUT OUT_TRUNC ERR_TRUNC OOM DURATION_MS CPU_MS PEAK_RSS\n
 *   \0NONCE:E CODE MESSAGE\n          (the command could not be started)
 *
 * EXIT is the exit status, or -N for death by signal N (-9 on timeout).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WORKSPACE "/workspace"
#define CHUNK 65536

extern char **environ;

static const char *nonce;
static int wake_w = -1;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Write all of buf (the Engine's stream may take it in pieces); a closed stream is ignored. */
static void write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return;
        }
        buf += n;
        len -= (size_t)n;
    }
}

static void trailer(const char *text) {
    char line[8192];
    int n = snprintf(line, sizeof line, "%c%s:%s\n", 0, nonce, text);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    write_all(2, line, (size_t)n);
}

static void on_sigchld(int sig) {
    (void)sig;
    int saved = errno;
    char b = 0;
    if (write(wake_w, &b, 1) < 0) { /* pipe full: a wake-up is already pending */ }
    errno = saved;
}

/* Pids (other than ours) whose environment holds SANDPIT_EXEC=<nonce>: they survive setsid. */
static int kill_tagged(void) {
    char tag[128];
    int tag_len = snprintf(tag, sizeof tag, "SANDPIT_EXEC=%s", nonce) + 1; /* with the NUL */
    pid_t self = getpid();
    int found = 0;
    DIR *proc = opendir("/proc");
    if (!proc) return 0;
    /* An environment can be as large as ARG_MAX: read all of it, growing the buffer. */
    static char *env = NULL;
    static size_t cap = 0;
    struct dirent *entry;
    while ((entry = readdir(proc)) != NULL) {
        char *end;
        long pid = strtol(entry->d_name, &end, 10);
        if (*end || pid <= 0 || pid == self) continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/environ", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t len = 0;
        for (;;) {
            if ((size_t)len + 1 >= cap) {
                size_t grown = cap ? cap * 2 : (1 << 16);
                char *bigger = realloc(env, grown);
                if (!bigger) break;
                env = bigger;
                cap = grown;
            }
            ssize_t n = read(fd, env + len, cap - (size_t)len - 1);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            len += n;
        }
        close(fd);
        if (len <= 0) continue;
        env[len] = 0;
        for (ssize_t i = 0; i < len;) {
            size_t item = strnlen(env + i, (size_t)(len - i));
            if ((int)item + 1 == tag_len && memcmp(env + i, tag, item) == 0) {
                kill((pid_t)pid, SIGKILL);
                found++;
                break;
            }
            i += (ssize_t)item + 1;
        }
    }
    closedir(proc);
    return found;
}

static void kill_tree(pid_t pid) {
    killpg(pid, SIGKILL);
    for (int round = 0; round < 20 && kill_tagged() > 0; round++) {
    }
}

static long oom_count(void) {
    static const char *paths[] = {"/sys/fs/cgroup/memory/memory.oom_control",
                                  "/sys/fs/cgroup/memory.events"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        FILE *f = fopen(paths[i], "re");
        if (!f) continue;
        char line[256];
        long value = -1;
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "oom_kill ", 9) == 0) {
                value = strtol(line + 9, NULL, 10);
                break;
            }
        }
        fclose(f);
        if (value >= 0) return value;
    }
    return -1;
}

/* Copy the first `need` bytes of stdin to `path`. */
static int save_code(const char *path, long need) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    static char buf[CHUNK];
    while (need > 0) {
        ssize_t n = read(0, buf, need < CHUNK ? (size_t)need : CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        write_all(fd, buf, (size_t)n);
        need -= n;
    }
    return close(fd);
}

/* The child's environment: ours without SANDPIT_INTERNAL, plus SANDPIT_EXEC=<nonce>. */
static char **child_env(void) {
    size_t count = 0;
    while (environ[count]) count++;
    char **env = calloc(count + 2, sizeof *env);
    if (!env) return NULL;
    size_t out = 0;
    for (size_t i = 0; i < count; i++) {
        if (strncmp(environ[i], "SANDPIT_INTERNAL=", 17) == 0) continue;
        if (strncmp(environ[i], "SANDPIT_EXEC=", 13) == 0) continue;
        env[out++] = environ[i];
    }
    size_t len = strlen(nonce) + 14;
    env[out] = malloc(len);
    if (!env[out]) return NULL;
    snprintf(env[out], len, "SANDPIT_EXEC=%s", nonce);
    return env;
}

int main(int argc, char **argv) {
    if (argc < 9) {
        fprintf(stderr, "usage: %s NONCE TIMEOUT CAP CWD WANT_STDIN CODE_LEN SUFFIX ARGV...\n",
                argv[0]);
        return 2;
    }
    nonce = argv[1];
    double timeout_s = strtod(argv[2], NULL);
    long long cap = strtoll(argv[3], NULL, 10);
    const char *cwd = argv[4];
    int want_stdin = strcmp(argv[5], "1") == 0;
    const char *code_len = argv[6];
    const char *code_suffix = argv[7];
    char **cmd = argv + 8;
    signal(SIGPIPE, SIG_IGN);

    char joined[PATH_MAX * 2];
    if (!*cwd) snprintf(joined, sizeof joined, "%s", WORKSPACE);
    else if (*cwd == '/') snprintf(joined, sizeof joined, "%s", cwd);
    else snprintf(joined, sizeof joined, "%s/%s", WORKSPACE, cwd);
    char real[PATH_MAX];
    struct stat st;
    if (!realpath(joined, real) || stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
        char message[PATH_MAX + 128];
        snprintf(message, sizeof message, "E file_not_found working directory does not exist: %s",
                 cwd);
        trailer(message);
        return 0;
    }

    char code_file[PATH_MAX] = "";
    if (*code_len) {
        mkdir("/tmp/.sandpit", 0777);
        snprintf(code_file, sizeof code_file, "/tmp/.sandpit/code-%s%s", nonce, code_suffix);
        if (save_code(code_file, strtol(code_len, NULL, 10)) != 0) {
            trailer("E provider_error could not write the code file");
            return 0;
        }
        for (char **arg = cmd; *arg; arg++)
            if (strcmp(*arg, "{file}") == 0) *arg = code_file;
    }

    char **env = child_env();
    int out_pipe[2], err_pipe[2], in_pipe[2] = {-1, -1}, wake[2];
    if (!env || pipe2(out_pipe, O_CLOEXEC) || pipe2(err_pipe, O_CLOEXEC) ||
        pipe2(wake, O_CLOEXEC | O_NONBLOCK)) {
        trailer("E provider_error could not set up the command's pipes");
        return 0;
    }
    int child_stdin;
    if (want_stdin) {
        if (pipe2(in_pipe, O_CLOEXEC)) {
            trailer("E provider_error could not set up the command's pipes");
            return 0;
        }
        child_stdin = in_pipe[0];
    } else {
        child_stdin = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    wake_w = wake[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);

    long oom_before = oom_count();
    double t0 = now_s();
    if (chdir(real) != 0) {
        trailer("E file_not_found working directory does not exist");
        return 0;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, child_stdin, 0);
    posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults, empty;
    /* Every signal at its default in the command, not only the SIGPIPE ignored above:
       whatever started the engine may have ignored SIGINT or SIGQUIT, which survives
       exec. glibc leaves its two internal signals (32, 33) out of sigfillset and would
       then start the command with them ignored, so they are added by hand. */
    sigfillset(&defaults);
#ifdef __GLIBC__
    for (int sig = 32; sig <= 33; sig++) {
        const size_t bits = 8 * sizeof defaults.__val[0];
        defaults.__val[(sig - 1) / bits] |= 1UL << ((sig - 1) % bits);
    }
#endif
    sigemptyset(&empty);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setsigmask(&attr, &empty);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF |
                                        POSIX_SPAWN_SETSIGMASK);
    pid_t pid;
    int spawn_error = posix_spawnp(&pid, cmd[0], &actions, &attr, cmd, env);
    if (spawn_error) {
        int missing = spawn_error == ENOENT;
        char message[PATH_MAX + 128];
        int n = snprintf(message, sizeof message, "sandpit: %s: %s\n", cmd[0],
                         missing ? "command not found" : strerror(spawn_error));
        write_all(2, message, (size_t)n);
        trailer(missing ? "R 127 0 0 0 0 0 0 0" : "R 126 0 0 0 0 0 0 0");
        if (*code_file) unlink(code_file);
        return 0;
    }
    close(child_stdin);
    close(out_pipe[1]);
    close(err_pipe[1]);

    int stream_fd[2] = {out_pipe[0], err_pipe[0]};  /* -1 once closed */
    long long written[2] = {0, 0};
    int truncated[2] = {0, 0};
    int stdin_open = want_stdin;
    int w_in = want_stdin ? in_pipe[1] : -1;
    if (w_in >= 0) fcntl(w_in, F_SETFL, fcntl(w_in, F_GETFL) | O_NONBLOCK);
    static char pending[CHUNK];
    size_t pending_len = 0, pending_off = 0;
    static char buf[CHUNK];
    double deadline = t0 + timeout_s, drain_until = 0;
    int have_status = 0, status = 0, timed_out = 0;
    struct rusage usage;
    memset(&usage, 0, sizeof usage);

    for (;;) {
        int open_streams = (stream_fd[0] >= 0) + (stream_fd[1] >= 0);
        if (have_status && (!open_streams || now_s() >= drain_until)) break;
        struct pollfd fds[5];
        int nfds = 0, slot_out = -1, slot_err = -1, slot_in = -1, slot_w = -1;
        if (stream_fd[0] >= 0) { slot_out = nfds; fds[nfds++] = (struct pollfd){stream_fd[0], POLLIN, 0}; }
        if (stream_fd[1] >= 0) { slot_err = nfds; fds[nfds++] = (struct pollfd){stream_fd[1], POLLIN, 0}; }
        int slot_wake = nfds;
        fds[nfds++] = (struct pollfd){wake[0], POLLIN, 0};
        if (stdin_open) {
            if (pending_len > pending_off) { slot_w = nfds; fds[nfds++] = (struct pollfd){w_in, POLLOUT, 0}; }
            else { slot_in = nfds; fds[nfds++] = (struct pollfd){0, POLLIN, 0}; }
        }
        double wait_s;
        double now = now_s();
        if (!have_status) {
            wait_s = deadline - now;
            if (wait_s <= 0) {
                timed_out = 1;
                kill_tree(pid);
                while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
                }
                have_status = 1;
                drain_until = now_s() + 0.1;
                continue;
            }
        } else {
            wait_s = drain_until - now;
            if (wait_s < 0) wait_s = 0;
        }
        int ready = poll(fds, (nfds_t)nfds, (int)(wait_s * 1000) + 1);
        if (ready < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[slot_wake].revents) {
            while (read(wake[0], buf, sizeof buf) > 0) {
            }
            if (!have_status && wait4(pid, &status, WNOHANG, &usage) == pid) {
                have_status = 1;
                drain_until = now_s() + 0.05;
            }
        }
        int slots[2] = {slot_out, slot_err};
        for (int s = 0; s < 2; s++) {
            if (slots[s] < 0 || !fds[slots[s]].revents) continue;
            ssize_t n = read(stream_fd[s], buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                close(stream_fd[s]);
                stream_fd[s] = -1;
                continue;
            }
            long long room = cap - written[s];
            if (room > 0) {
                size_t part = (long long)n < room ? (size_t)n : (size_t)room;
                write_all(s + 1, buf, part);
                written[s] += (long long)part;
            }
            if ((long long)n > room) truncated[s] = 1;
        }
        if (slot_in >= 0 && fds[slot_in].revents) {
            ssize_t n = read(0, pending, sizeof pending);
            if (n > 0) {
                pending_len = (size_t)n;
                pending_off = 0;
            } else if (n == 0 || errno != EINTR) {
                close(w_in);
                stdin_open = 0;
            }
        }
        if (slot_w >= 0 && fds[slot_w].revents) {
            ssize_t n = write(w_in, pending + pending_off, pending_len - pending_off);
            if (n > 0) {
                pending_off += (size_t)n;
            } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
                close(w_in); /* the command closed its stdin: drop the rest */
                stdin_open = 0;
            }
        }
    }
    if (*code_file) unlink(code_file);
    long oom_after = oom_count();
    int code;
    if (timed_out) code = -9;
    else if (WIFSIGNALED(status)) code = -WTERMSIG(status);
    else code = WEXITSTATUS(status);
    int oom = oom_before >= 0 && oom_after > oom_before && code == -9;
    double cpu_ms = (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000.0 +
                    (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000.0;
    char text[256];
    snprintf(text, sizeof text, "R %d %d %d %d %d %.3f %.3f %ld", code, timed_out, truncated[0],
             truncated[1], oom, (now_s() - t0) * 1000.0, cpu_ms, usage.ru_maxrss * 1024L);
    trailer(text);
    return 0;
}
