/*
 * jail_launch: start a jail's bwrap in a mount namespace holding only the mounts it reads.
 *
 * Usage: jail_launch ROOT KEEP UID NEEDS PROGRAM [ARG...]
 *
 * Every live sandbox has a tmpfs mounted under ROOT in the host's mount namespace
 * (volume.py), and the host has mounts of its own no jail reads (/sys and its cgroups, a
 * container engine's, other disks). bwrap copies its caller's namespace and re-reads the
 * whole mount table for each of its binds, so each of those mounts made every jail's start
 * dearer. Run as root by the local provider in place of setpriv, this program:
 *
 *   1. enters a new mount namespace that shares no mount events with the host's either way
 *      (MS_PRIVATE): nothing done here unmounts anything on the host, and the sandboxes
 *      mounted later do not pile up in it for the jail's lifetime (bwrap's own process stays
 *      in it);
 *   2. detaches every mount under ROOT/ except KEEP (the starting sandbox's own volume;
 *      "" keeps none), and every other mount but those that hold, are, or lie under ROOT
 *      or one of NEEDS (absolute paths, one per line: what bwrap binds from and reads;
 *      "/" keeps them all);
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

/* Whether the mount at `point` holds `path`, is it, or lies under it. */
static int related(const char *point, const char *path) {
    size_t point_len = strlen(point), path_len = strlen(path);
    if (strcmp(point, "/") == 0 || strcmp(path, "/") == 0) return 1;
    if (point_len <= path_len)
        return strncmp(path, point, point_len) == 0 &&
               (path[point_len] == '\0' || path[point_len] == '/');
    return strncmp(point, path, path_len) == 0 && point[path_len] == '/';
}

/* Whether the mount at `point` stays in the jail's namespace (see step 2 above). */
static int wanted(const char *point, const char *root, const char *keep, char **needs) {
    size_t root_len = strlen(root);
    if (strncmp(point, root, root_len) == 0 && point[root_len] == '/')
        return strcmp(point, keep) == 0;
    if (related(point, root)) return 1;
    for (char **need = needs; *need != NULL; need++)
        if (related(point, *need)) return 1;
    return 0;
}

/* NEEDS split at its newlines, in place; NULL-terminated. */
static char **split_needs(char *text) {
    size_t count = 1;
    for (char *at = text; *at; at++) count += *at == '\n';
    char **needs = calloc(count + 1, sizeof *needs);
    if (needs == NULL) return NULL;
    size_t found = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n"))
        needs[found++] = line;
    return needs;
}

static int detach_others(const char *root, const char *keep, char **needs) {
    FILE *table = fopen("/proc/self/mountinfo", "re");
    if (table == NULL) return fail("/proc/self/mountinfo");
    char **doomed = NULL;
    size_t count = 0, size = 0;
    char *line = NULL;
    size_t line_size = 0;
    while (getline(&line, &line_size, table) >= 0) {
        char *point = mount_point(line);
        if (point == NULL || wanted(point, root, keep, needs)) continue;
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
    if (argc < 6 || argv[1][0] != '/' || (argv[2][0] != '\0' && argv[2][0] != '/') ||
        argv[4][0] != '/') {
        fprintf(stderr, "usage: jail_launch /ROOT /KEEP|'' UID|- /NEEDS PROGRAM [ARG...]\n");
        return FAILED;
    }
    const char *root = argv[1], *keep = argv[2];
    char **needs = split_needs(argv[4]);
    if (needs == NULL) return fail("calloc");
    for (char **need = needs; *need != NULL; need++) {
        if ((*need)[0] != '/') {
            errno = EINVAL;
            return fail(*need);
        }
    }
    if (unshare(CLONE_NEWNS) != 0) return fail("unshare");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return fail("make-rprivate");
    int status = detach_others(root, keep, needs);
    if (status != 0) return status;
    if ((status = drop_to(argv[3])) != 0) return status;
    execv(argv[5], argv + 5);
    return fail(argv[5]);
}
