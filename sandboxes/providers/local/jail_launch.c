/*
 * jail_launch: start a jail's bwrap in a mount namespace without the other sandboxes' volumes.
 *
 * Usage: jail_launch ROOT KEEP UID PROGRAM [ARG...]
 *
 * Every live sandbox has a tmpfs mounted under ROOT in the host's mount namespace
 * (volume.py). bwrap copies its caller's namespace and re-reads the whole mount table for
 * each of its binds, so each live sandbox made every later jail's start dearer. Run as root
 * by the local provider in place of setpriv, this program:
 *
 *   1. enters a new mount namespace that shares no mount events with the host's either way
 *      (MS_PRIVATE): nothing done here unmounts anything on the host, and the sandboxes
 *      mounted later do not pile up in it for the jail's lifetime (bwrap's own process stays
 *      in it);
 *   2. detaches every mount under ROOT/ except KEEP (the starting sandbox's own volume;
 *      "" keeps none);
 *   3. drops to UID (gid UID, no supplementary groups; "-" stays root) and execs PROGRAM.
 *
 * Exits 125 before exec when a step fails, having changed nothing the host can see.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#define FAILED 125
#define MAX_MOUNTS 65536

static int fail(const char *what) {
    fprintf(stderr, "jail_launch: %s: %s\n", what, strerror(errno));
    return FAILED;
}

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape(char *text) {
    char *out = text;
    for (char *in = text; *in; in++) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7' &&
            in[3] >= '0' && in[3] <= '7') {
            *out++ = (char)(((in[1] - '0') << 6) | ((in[2] - '0') << 3) | (in[3] - '0'));
            in += 3;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
}

/* The fifth field of a mountinfo line (the mount point), unescaped in place; NULL if short. */
static char *mount_point(char *line) {
    char *field = line;
    for (int skip = 0; skip < 4; skip++) {
        field = strchr(field, ' ');
        if (field == NULL) return NULL;
        field++;
    }
    char *end = strchr(field, ' ');
    if (end == NULL) return NULL;
    *end = '\0';
    unescape(field);
    return field;
}

static int detach_others(const char *root, const char *keep) {
    FILE *table = fopen("/proc/self/mountinfo", "re");
    if (table == NULL) return fail("/proc/self/mountinfo");
    size_t root_len = strlen(root);
    char **doomed = NULL;
    size_t count = 0, size = 0;
    char *line = NULL;
    size_t line_size = 0;
    while (getline(&line, &line_size, table) >= 0) {
        char *point = mount_point(line);
        if (point == NULL || strncmp(point, root, root_len) != 0 || point[root_len] != '/')
            continue;
        if (strcmp(point, keep) == 0) continue;
        if (count == size) {
            size = size ? size * 2 : 64;
            if (size > MAX_MOUNTS) break;
            char **grown = realloc(doomed, size * sizeof *doomed);
            if (grown == NULL) return fail("realloc");
            doomed = grown;
        }
        if ((doomed[count] = strdup(point)) == NULL) return fail("strdup");
        count++;
    }
    free(line);
    fclose(table);
    /* Newest first: a detached parent takes its children along (EINVAL for them after). */
    while (count > 0) {
        count--;
        if (umount2(doomed[count], MNT_DETACH | UMOUNT_NOFOLLOW) != 0 && errno != EINVAL &&
            errno != ENOENT)
            return fail(doomed[count]);
        free(doomed[count]);
    }
    free(doomed);
    return 0;
}

static int drop_to(const char *uid_text) {
    if (strcmp(uid_text, "-") == 0) return 0;
    char *end;
    errno = 0;
    unsigned long value = strtoul(uid_text, &end, 10);
    if (errno != 0 || *end != '\0' || end == uid_text || value == 0 || value > 0xfffffffeUL) {
        errno = EINVAL;
        return fail("uid");
    }
    uid_t uid = (uid_t)value;
    if (setgroups(0, NULL) != 0) return fail("setgroups");
    if (setresgid(uid, uid, uid) != 0) return fail("setresgid");
    if (setresuid(uid, uid, uid) != 0) return fail("setresuid");
    if (getuid() != uid || geteuid() != uid || getgid() != uid || getegid() != uid) {
        errno = EPERM;
        return fail("uid check");
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5 || argv[1][0] != '/' || (argv[2][0] != '\0' && argv[2][0] != '/')) {
        fprintf(stderr, "usage: jail_launch /ROOT /KEEP|'' UID|- PROGRAM [ARG...]\n");
        return FAILED;
    }
    const char *root = argv[1], *keep = argv[2];
    if (unshare(CLONE_NEWNS) != 0) return fail("unshare");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return fail("make-rprivate");
    int status = detach_others(root, keep);
    if (status != 0) return status;
    if ((status = drop_to(argv[3])) != 0) return status;
    execv(argv[4], argv + 4);
    return fail(argv[4]);
}
