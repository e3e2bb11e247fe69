/* The per-worker supervisor in C: what `python -m astraeus.agent.runtime.shim SPEC` does (see shim.py's docstring),
 * for an isolated worker (an agent that runs as root) that is not a container, whose view the shim launcher
 * prepared (astraeus.agent.runtime.mounts.TEMPLATE). The launcher decides (astraeus.agent.runtime.native), makes the
 * worker's folders, config files and cgroups, opens its drives (and clones them and the configs as detached mounts),
 * and starts this binary with posix_spawn; every other worker gets the Python shim. Why: a Python shim and its worker's PID 1 are two forks of a Python process per worker, a third of
 * a trivial run's CPU on a small machine (benchmarks/README.md, "Worker starts").
 *
 * It keeps the Python shim's whole contract, file for file: shim.json, started.json, log.jsonl (the same lines,
 * byte for byte: invalid UTF-8 replaced, non-ASCII escaped, lines split at 64 KiB, a partial line flushed after
 * 1 s, rotation into log.jsonl.1 with a {"base": N} header), exit.json (exit code or signal, killed, stop_requested,
 * the OOM verdict and message), failed.json; a stop (stop.json + SIGUSR1, or SIGTERM to it) writes the stop reason
 * file, SIGTERMs the main process and SIGKILLs the whole tree (cgroup, process group, descendants, processes marked
 * with the worker's ASTRAEUS_WORKER_ID) when the grace runs out; what the main process leaves behind is killed; a
 * wiped worker folder is written again. The worker's PID 1 builds the view from the prepared one exactly as
 * mounts.WorkerView(template=...) does, in an IPC namespace of its own, drops to the workspace's user, installs the
 * seccomp filter the plan gives (the Python shim's program, astraeus.agent.runtime.seccomp) and spawns the command.
 *
 * Input: the launcher writes the plan on descriptor 4 as NUL-terminated `key=value` entries, so that the
 * worker's environment never shows on a command line; descriptor 3 is the prepared view's mount namespace, and
 * the drives' and configs' detached mounts are at the descriptors their entries name.
 * Linux only, libc only. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x4
#endif
#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef POSIX_SPAWN_SETSID
#define POSIX_SPAWN_SETSID 0x80
#endif

#define MAX_LINE (64 * 1024)
#define MAXN 4096
#define TEMPLATE_FD 3
#define PLAN_FD 4

/* ------------------------------------------------------------------ the plan */
static char *dir, *cwd, *command, *marker, *spec_text, *limits_json = "null", *cgroups_json = "null",
            *cgroup_json = "null", *oom_message, *oom_limit = "null", *cg_v2, *cg_freezer, *cg_mem, *seccomp_hex,
            *netns_path;
static char *args[MAXN], *envs[MAXN], *hides[256], *exposes[256], *cgdirs[16], *warns[64];
static int nargs, nenvs, nhides, nexposes, ncg, nwarns, cg_mem_v;
static struct mountable {
    int fd, read_only;
    char *path;
} drives[64], configs[64];
static int ndrives, nconfigs;
static int uid = -1, gid = -1;
static double stop_grace = 30;
/* the plan's "signal" (Slurm's --signal): signo, seconds after the command's start, to the main process alone */
static int signal_signo = 0, signal_batch_only = 0;
static double signal_after = 0, signal_at = 0;
static long long log_half = 32 * 1024 * 1024;

static char sigdir[4200], state_dir[4200], spec_path[4200];

static double round_to(double v, double scale) { /* Python's round(v, digits) for these magnitudes */
    double x = v * scale;
    return (double)(long long)(x >= 0 ? x + 0.5 : x - 0.5) / scale;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void slog(const char *fmt, ...) {
    char msg[8192], stamp[32];
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dprintf(2, "%s shim[%d] %s\n", stamp, getpid(), msg);
}

static void read_plan(void) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 65536 > cap) buf = realloc(buf, cap *= 2);
        ssize_t r = read(PLAN_FD, buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += r;
    }
    close(PLAN_FD);
    buf[len] = 0;
    for (char *p = buf, *next; p < buf + len; p = next) {
        next = p + strlen(p) + 1;
        char *v = strchr(p, '=');
        if (!v) continue;
        *v++ = 0;
#define ONE(k, var) else if (!strcmp(p, k)) var = v
#define MANY(k, arr, n) else if (!strcmp(p, k)) { if (n < (int)(sizeof arr / sizeof *arr) - 1) arr[n++] = v; }
        if (0) {}
        ONE("dir", dir); ONE("cwd", cwd); ONE("command", command); ONE("marker", marker); ONE("spec", spec_text);
        ONE("limits", limits_json); ONE("cgroups", cgroups_json); ONE("cgroup", cgroup_json);
        ONE("oom_message", oom_message); ONE("oom_limit", oom_limit); ONE("cg_v2", cg_v2);
        ONE("cg_freezer", cg_freezer); ONE("cg_mem", cg_mem); ONE("seccomp", seccomp_hex); ONE("netns", netns_path);
        MANY("arg", args, nargs) MANY("env", envs, nenvs) MANY("hide", hides, nhides)
        MANY("expose", exposes, nexposes) MANY("cg", cgdirs, ncg) MANY("warn", warns, nwarns)
        else if ((!strcmp(p, "drive") && ndrives < 64) || (!strcmp(p, "config") && nconfigs < 64)) {
            /* "FD RO PATH": a detached mount (open_tree) the launcher made, at descriptor FD */
            struct mountable *m = !strcmp(p, "drive") ? &drives[ndrives++] : &configs[nconfigs++];
            char *sp1 = strchr(v, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
            if (!sp2) continue;
            m->fd = atoi(v);
            m->read_only = atoi(sp1 + 1);
            m->path = sp2 + 1;
        }
        else if (!strcmp(p, "cg_mem_v")) cg_mem_v = atoi(v);
        else if (!strcmp(p, "uid")) uid = atoi(v);
        else if (!strcmp(p, "gid")) gid = atoi(v);
        else if (!strcmp(p, "stop_grace")) stop_grace = atof(v);
        else if (!strcmp(p, "signal")) sscanf(v, "%d %lf %d", &signal_signo, &signal_after, &signal_batch_only);
        else if (!strcmp(p, "log_half")) log_half = atoll(v);
    }
}

/* ------------------------------------------------------------------ /proc */
static ssize_t read_small(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = 0;
    ssize_t r;
    while (n < size - 1 && (r = read(fd, buf + n, size - 1 - n)) > 0) n += r;
    close(fd);
    buf[n] = 0;
    return n;
}

/* /proc/PID/stat's fields after the command name: [0] the state, [1] the parent, [19] the start in ticks */
static int stat_field(pid_t pid, int index, char *out, size_t outsize) {
    char p[64], buf[4096];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    if (read_small(p, buf, sizeof buf) <= 0) return -1;
    char *s = strrchr(buf, ')');
    if (!s) return -1;
    s += 2;
    for (int i = 0; i < index; i++) {
        s = strchr(s, ' ');
        if (!s) return -1;
        s++;
    }
    size_t n = strcspn(s, " \n");
    if (n >= outsize) n = outsize - 1;
    memcpy(out, s, n);
    out[n] = 0;
    return 0;
}

static double create_time(pid_t pid) {
    char f[64];
    if (stat_field(pid, 19, f, sizeof f)) return -1;
    static double btime = -1;
    if (btime < 0) {
        char buf[8192];
        if (read_small("/proc/stat", buf, sizeof buf) > 0) {
            char *b = strstr(buf, "\nbtime ");
            if (b) btime = atof(b + 7);
        }
    }
    return strtoull(f, NULL, 10) / (double)sysconf(_SC_CLK_TCK) + btime;
}

static int live(pid_t pid) {
    char f[8];
    return !stat_field(pid, 0, f, sizeof f) && f[0] != 'Z';
}

/* ------------------------------------------------------------------ files */
static void path_of(char *out, size_t size, const char *name) { snprintf(out, size, "%s/%s", dir, name); }

static int exists(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void makedirs(const char *path, mode_t mode) {
    char p[4200];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, mode);
            *s = '/';
        }
    mkdir(p, mode);
}

static void notify_agent(void) {
    char p[4300];
    snprintf(p, sizeof p, "%s/events.fifo", state_dir);
    int fd = open(p, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return;
    if (write(fd, "!", 1) < 0) {}
    close(fd);
}

static int write_all(int fd, const char *data, size_t len) {
    while (len) {
        ssize_t w = write(fd, data, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        data += w;
        len -= w;
    }
    return 0;
}

/* write_json(): whole (a temporary file renamed into place); started/exit/failed wake the agent; exit/failed are
 * synced to disk after the agent is woken */
static void write_file(const char *name, const char *data) {
    char p[4300], tmp[4400];
    path_of(p, sizeof p, name);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", p, getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ENOENT) { /* the folder was wiped */
        makedirs(dir, 0777);
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    }
    if (fd < 0) {
        slog("cannot write %s: %s", name, strerror(errno));
        return;
    }
    write_all(fd, data, strlen(data));
    if (rename(tmp, p)) slog("cannot write %s: %s", name, strerror(errno));
    int outcome = !strcmp(name, "exit.json") || !strcmp(name, "failed.json");
    if (outcome || !strcmp(name, "started.json")) notify_agent();
    if (outcome) fsync(fd);
    close(fd);
}

/* ------------------------------------------------------------------ JSON out: as Python's json.dumps */
typedef struct {
    char *s;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void puts_(buf_t *b, const char *s) { put(b, s, strlen(s)); }
static void putf(buf_t *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof tmp) { /* longer than the stack buffer: formatted again at its length, never cut */
        char *big = malloc((size_t)n + 1);
        vsnprintf(big, (size_t)n + 1, fmt, again);
        put(b, big, (size_t)n);
        free(big);
    } else if (n > 0) {
        put(b, tmp, (size_t)n);
    }
    va_end(again);
}

static void put_u(buf_t *b, unsigned u) { putf(b, "\\u%04x", u); }

static void put_cp(buf_t *b, unsigned cp) {
    if (cp == '"') puts_(b, "\\\"");
    else if (cp == '\\') puts_(b, "\\\\");
    else if (cp == '\n') puts_(b, "\\n");
    else if (cp == '\r') puts_(b, "\\r");
    else if (cp == '\t') puts_(b, "\\t");
    else if (cp == '\b') puts_(b, "\\b");
    else if (cp == '\f') puts_(b, "\\f");
    else if (cp < 0x20) put_u(b, cp);
    else if (cp < 0x7f) {
        char c = (char)cp;
        put(b, &c, 1);
    } else if (cp < 0x10000) put_u(b, cp);
    else {
        cp -= 0x10000;
        put_u(b, 0xd800 | (cp >> 10));
        put_u(b, 0xdc00 | (cp & 0x3ff));
    }
}

/* `s` (n bytes) as a JSON string, decoded as Python's bytes.decode("utf-8", errors="replace") does: each maximal
 * invalid subpart becomes one U+FFFD */
static void put_text(buf_t *b, const unsigned char *s, size_t n) {
    put(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            put_cp(b, c);
            i++;
            continue;
        }
        int need;
        unsigned lo = 0x80, hi = 0xbf, cp;
        if (c >= 0xc2 && c <= 0xdf) need = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef) {
            need = 2, cp = c & 0x0f;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3, cp = c & 0x07;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
        } else {
            put_u(b, 0xfffd);
            i++;
            continue;
        }
        size_t j = i + 1;
        int ok = 1;
        for (int k = 0; k < need; k++, j++) {
            if (j >= n || s[j] < lo || s[j] > hi) {
                ok = 0;
                break;
            }
            cp = (cp << 6) | (s[j] & 0x3f);
            lo = 0x80, hi = 0xbf;
        }
        if (ok) put_cp(b, cp);
        else put_u(b, 0xfffd);
        i = j;
    }
    put(b, "\"", 1);
}

/* a float as Python's repr() writes it (the shortest that reads back the same) */
static void put_float(buf_t *b, double v) {
    char tmp[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    if (!strpbrk(tmp, ".en")) strcat(tmp, ".0");
    puts_(b, tmp);
}

/* ------------------------------------------------------------------ JSON in: a flat object's member, raw */
static const char *skip_ws(const char *s) {
    while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') s++;
    return s;
}

static const char *skip_string(const char *s) { /* s at the opening quote: after the closing one, or NULL */
    for (s++; *s; s++) {
        if (*s == '\\') {
            if (!*++s) return NULL;
        } else if (*s == '"') return s + 1;
    }
    return NULL;
}

/* the raw JSON text of top-level member `key` of object `obj` (a string with its quotes, a number, ...), or NULL */
static const char *member(const char *obj, const char *key, size_t *len) {
    const char *s = skip_ws(obj);
    if (*s != '{') return NULL;
    s++;
    for (;;) {
        s = skip_ws(s);
        if (*s != '"') return NULL;
        const char *k = s + 1, *ke = skip_string(s);
        if (!ke) return NULL;
        int match = (size_t)(ke - 1 - k) == strlen(key) && !strncmp(k, key, ke - 1 - k);
        s = skip_ws(ke);
        if (*s != ':') return NULL;
        s = skip_ws(s + 1);
        const char *v = s;
        int depth = 0;
        for (;;) {
            if (*s == '"') {
                s = skip_string(s);
                if (!s) return NULL;
                if (!depth) break;
                continue;
            }
            if (!*s) return NULL;
            if (*s == '{' || *s == '[') depth++;
            else if (*s == '}' || *s == ']') {
                if (!depth) break;
                depth--;
                if (!depth) {
                    s++;
                    break;
                }
            } else if (*s == ',' && !depth) break;
            s++;
        }
        const char *ve = s;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\n' || ve[-1] == '\t' || ve[-1] == '\r')) ve--;
        if (match) {
            *len = ve - v;
            return v;
        }
        s = skip_ws(s);
        if (*s == ',') s++;
        else return NULL;
    }
}

static int number_member(const char *obj, const char *key, double *out) {
    size_t n;
    const char *v = member(obj, key, &n);
    if (!v || !n || !(*v == '-' || (*v >= '0' && *v <= '9'))) return 0;
    *out = strtod(v, NULL);
    return 1;
}

/* ------------------------------------------------------------------ the log */
static int log_fd = -1;
static long long log_pos, seq;
static buf_t partial[2];
static double partial_since[2];
static const char *stream_name[2] = {"stdout", "stderr"};

static int open_log(void) {
    char p[4300];
    path_of(p, sizeof p, "log.jsonl");
    int fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ENOENT) { /* the folder was wiped */
        makedirs(dir, 0777);
        fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    }
    if (fd < 0) {
        slog("cannot open the log: %s", strerror(errno));
        return -1;
    }
    int old = log_fd;
    struct stat so, sn;
    fstat(fd, &sn);
    log_fd = fd;
    log_pos = sn.st_size;
    if (old >= 0) {
        if (!fstat(old, &so) && so.st_nlink == 0 && sn.st_size == 0) {
            /* the folder was wiped: carry the deleted file's lines over (the agent may not have shipped them) */
            char fdp[64], chunk[65536];
            snprintf(fdp, sizeof fdp, "/proc/self/fd/%d", old);
            int r = open(fdp, O_RDONLY | O_CLOEXEC);
            ssize_t n;
            if (r < 0) slog("cannot carry the old log over: %s", strerror(errno));
            while (r >= 0 && (n = read(r, chunk, sizeof chunk)) > 0) {
                write_all(fd, chunk, n);
                log_pos += n;
            }
            if (r >= 0) close(r);
        }
        close(old);
    }
    return 0;
}

static long long read_log_base(const char *p) {
    char buf[300];
    if (read_small(p, buf, 257) <= 0 || strncmp(buf, "{\"base\":", 8)) return 0;
    return atoll(buf + 8);
}

static void rotate_log(void) {
    char p[4300], p1[4300], fresh[4300];
    path_of(p, sizeof p, "log.jsonl");
    path_of(p1, sizeof p1, "log.jsonl.1");
    path_of(fresh, sizeof fresh, "log.jsonl.new");
    long long base = read_log_base(p) + log_pos;
    int fd = open(fresh, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        slog("cannot write log: %s", strerror(errno));
        return;
    }
    char head[64];
    int n = snprintf(head, sizeof head, "{\"base\": %lld}\n", base);
    write_all(fd, head, n);
    close(log_fd);
    log_fd = fd;
    log_pos = n;
    rename(p, p1);
    rename(fresh, p);
}

static void emit(int stream, const char *s, size_t n, double t) {
    while (n && s[n - 1] == '\r') n--;
    static buf_t line;
    line.n = 0;
    putf(&line, "{\"seq\": %lld, \"time\": ", ++seq);
    put_float(&line, round_to(t, 1e6));
    putf(&line, ", \"stream\": \"%s\", \"text\": ", stream_name[stream]);
    put_text(&line, (const unsigned char *)s, n);
    puts_(&line, "}\n");
    if (log_pos + (long long)line.n > log_half && log_pos > 0) rotate_log();
    if (write_all(log_fd, line.s, line.n)) slog("cannot write log: %s", strerror(errno));
    else log_pos += line.n;
}

static void feed(int stream, const char *chunk, size_t n, double t) {
    buf_t *b = &partial[stream];
    if (!b->n) partial_since[stream] = t;
    put(b, chunk, n);
    size_t start = 0;
    for (;;) {
        char *nl = memchr(b->s + start, '\n', b->n - start);
        if (!nl) break;
        emit(stream, b->s + start, nl - (b->s + start), t);
        start = nl - b->s + 1;
        partial_since[stream] = t;
    }
    while (b->n - start >= MAX_LINE) {
        emit(stream, b->s + start, MAX_LINE, t);
        start += MAX_LINE;
    }
    memmove(b->s, b->s + start, b->n - start);
    b->n -= start;
}

static void flush_partials(double t, int force) {
    for (int i = 0; i < 2; i++)
        if (partial[i].n && (force || t - partial_since[i] >= 1.0)) {
            emit(i, partial[i].s, partial[i].n, t);
            partial[i].n = 0;
        }
}

/* ------------------------------------------------------------------ cgroups (astraeus.agent.runtime.cgroups) */
static int cg_pids(pid_t *out, int max) {
    int n = 0;
    for (int i = 0; i < ncg; i++) {
        char p[4300], buf[65536];
        snprintf(p, sizeof p, "%s/cgroup.procs", cgdirs[i]);
        if (read_small(p, buf, sizeof buf) <= 0) continue;
        char *save = NULL;
        for (char *s = strtok_r(buf, "\n", &save); s && n < max; s = strtok_r(NULL, "\n", &save)) out[n++] = atoi(s);
    }
    return n;
}

static int cg_write(const char *d, const char *file, const char *v) {
    char p[4300];
    snprintf(p, sizeof p, "%s/%s", d, file);
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int r = write_all(fd, v, strlen(v));
    int e = errno;
    close(fd);
    errno = e;
    return r;
}

static void cg_drop(int i) {
    if (cg_v2 && !strcmp(cg_v2, cgdirs[i])) cg_v2 = NULL;
    if (cg_freezer && !strcmp(cg_freezer, cgdirs[i])) cg_freezer = NULL;
    if (cg_mem && !strcmp(cg_mem, cgdirs[i])) cg_mem = NULL;
    for (int j = i; j < ncg - 1; j++) cgdirs[j] = cgdirs[j + 1];
    ncg--;
}

static void cg_kill(void) {
    if (cg_v2) cg_write(cg_v2, "cgroup.kill", "1");
    int frozen = 0;
    if (cg_freezer && !cg_write(cg_freezer, "freezer.state", "FROZEN")) {
        frozen = 1;
        char p[4300], st[64];
        snprintf(p, sizeof p, "%s/freezer.state", cg_freezer);
        for (int i = 0; i < 50; i++) {
            if (read_small(p, st, sizeof st) <= 0 || !strncmp(st, "FROZEN", 6)) break;
            usleep(10000);
        }
    }
    pid_t pids[4096];
    int n = cg_pids(pids, 4096);
    for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
    if (frozen) cg_write(cg_freezer, "freezer.state", "THAWED");
}

static long long field_of(const char *text, const char *key) {
    size_t k = strlen(key);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, key, k) && l[k] == ' ') return atoll(l + k + 1);
    return 0;
}

static long long oom_kills(void) {
    if (!cg_mem) return 0;
    char p[4300], buf[4096];
    if (cg_mem_v == 2) {
        snprintf(p, sizeof p, "%s/memory.events", cg_mem);
        return read_small(p, buf, sizeof buf) > 0 ? field_of(buf, "oom_kill") : 0;
    }
    snprintf(p, sizeof p, "%s/memory.oom_control", cg_mem);
    if (read_small(p, buf, sizeof buf) > 0 && strstr(buf, "oom_kill ")) return field_of(buf, "oom_kill");
    snprintf(p, sizeof p, "%s/memory.failcnt", cg_mem);
    return read_small(p, buf, sizeof buf) > 0 && atoll(buf) > 0;
}

static void cleanup_cgroup(void) {
    if (!ncg) return;
    double end = now() + 1.0;
    for (;;) {
        int still = 0;
        for (int i = 0; i < ncg; i++)
            if (rmdir(cgdirs[i]) && errno != ENOENT) still++;
        if (!still) return;
        if (now() >= end) {
            slog("cannot remove the cgroup %s: processes are left in it", cgdirs[0]);
            return;
        }
        usleep(20000);
    }
}

/* ------------------------------------------------------------------ state */
static pid_t pid = 0, init_pid = 0;
static double pid_ctime, shim_ctime, finished_at;
static int status_r = -1, status = 0, have_status = 0, stop_requested = 0, killed = 0, leftovers_killed = 0;
static int sigterm = 0;
static double deadline = 0;
static char *started_json;

static void fail(const char *message) {
    slog("start failed: %s", message);
    cleanup_cgroup();
    buf_t b = {0};
    puts_(&b, "{\"message\": ");
    put_text(&b, (const unsigned char *)message, strlen(message));
    puts_(&b, ", \"time\": ");
    put_float(&b, now());
    puts_(&b, "}");
    write_file("failed.json", b.s);
    exit(0);
}

static void write_shim_json(void) {
    buf_t b = {0};
    putf(&b, "{\"shim_pid\": %d, \"shim_create_time\": ", getpid());
    put_float(&b, shim_ctime);
    puts_(&b, "}");
    write_file("shim.json", b.s);
    free(b.s);
}

/* ------------------------------------------------------------------ the worker's view (mounts.WorkerView) */
static dev_t ours[512];
static int nours;
static char *ro_later[64];
static int nro_later, nstage;
static int res_fd = -1; /* PID 1's pipe to the shim: "FAIL:<message>" or the command's start error */

static const char *fail_prefix; /* what is being mounted, as the Python shim's messages name it */

static void view_fail(const char *fmt, ...) {
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (fail_prefix) dprintf(res_fd, "FAIL:%s: %s", fail_prefix, msg);
    else dprintf(res_fd, "FAIL:%s", msg);
    _exit(126);
}

static int is_ours(dev_t d) {
    for (int i = 0; i < nours; i++)
        if (ours[i] == d) return 1;
    return 0;
}

static void tmpfs(const char *path, mode_t mode, uid_t u, gid_t g) {
    char opts[128];
    snprintf(opts, sizeof opts, "mode=%o,uid=%d,gid=%d", mode, u, g);
    if (mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts))
        view_fail("cannot build the worker's view: mount tmpfs on %s: %s", path, strerror(errno));
    struct stat st;
    if (!stat(path, &st) && nours < 512) ours[nours++] = st.st_dev;
}

static void hide_again(void) {
    struct stat st;
    for (int i = 0; i < nhides; i++) {
        const char *h = hides[i];
        if (!strcmp(h, "/") || !strcmp(h, "/tmp") || !strcmp(h, "/root")) continue;
        if (!stat(h, &st) && S_ISDIR(st.st_mode) && !is_ours(st.st_dev)) tmpfs(h, 0755, 0, 0);
    }
}

static int open_tree_of(const char *path) {
    int fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int t = syscall(SYS_open_tree, fd, "", OPEN_TREE_CLONE | AT_EMPTY_PATH | O_CLOEXEC);
    int e = errno;
    close(fd);
    errno = e;
    return t;
}

/* make `d` (a host folder in the view) a tmpfs holding a bind of each of its entries */
static void explode(const char *d, const char *what) {
    if (!strcmp(d, "/"))
        view_fail("%s: a new entry in the view's root is not possible here", what); /* the launcher checks first */
    char stage[64], src[4300], dst[4300];
    snprintf(stage, sizeof stage, "/tmp/.astraeus-stage-%d", ++nstage);
    struct stat st;
    if (mkdir(stage, 0700) || stat(d, &st) || mount(d, stage, NULL, MS_BIND | MS_REC, NULL))
        view_fail("cannot build the worker's view: %s: %s", d, strerror(errno));
    tmpfs(d, st.st_mode & 07777, st.st_uid, st.st_gid);
    DIR *dd = opendir(stage);
    struct dirent *e;
    while (dd && (e = readdir(dd))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(src, sizeof src, "%s/%s", stage, e->d_name);
        snprintf(dst, sizeof dst, "%s/%s", strcmp(d, "/") ? d : "", e->d_name);
        struct stat es;
        if (lstat(src, &es)) continue;
        int bad = 0;
        if (S_ISLNK(es.st_mode)) {
            char target[4096];
            ssize_t n = readlink(src, target, sizeof target - 1);
            if (n >= 0) {
                target[n] = 0;
                bad = symlink(target, dst);
            }
        } else if (S_ISDIR(es.st_mode)) {
            bad = mkdir(dst, 0755) || mount(src, dst, NULL, MS_BIND | MS_REC, NULL);
        } else {
            int fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (fd >= 0) close(fd);
            bad = fd < 0 || mount(src, dst, NULL, MS_BIND, NULL);
        }
        if (bad) view_fail("cannot build the worker's view: %s: %s", dst, strerror(errno));
    }
    if (dd) closedir(dd);
    umount2(stage, MNT_DETACH);
    rmdir(stage);
    if (nro_later < 64) ro_later[nro_later++] = strdup(d);
}

/* make `path` (absolute, normalised) exist in the view, never on the host, so a folder (or, not `folder`, a file)
 * can be mounted on it (mounts.WorkerView.make) */
static void make_path(const char *path, int folder, const char *what) {
    struct stat st;
    if (!lstat(path, &st)) {
        if (folder && !is_dir(path)) view_fail("%s %s exists and is not a folder", what, path);
        if (!folder && is_dir(path)) view_fail("config mount path %s is a folder", path);
        return;
    }
    char cur[4300] = "/", part[4300];
    const char *s = path;
    while (*s) {
        while (*s == '/') s++;
        if (!*s) break;
        size_t n = strcspn(s, "/");
        snprintf(part, sizeof part, "%.*s", (int)n, s);
        s += n;
        while (*s == '/') s++;
        int last = !*s;
        char nxt[8700];
        snprintf(nxt, sizeof nxt, "%s%s%s", cur, strcmp(cur, "/") ? "/" : "", part);
        if (!lstat(nxt, &st)) {
            char real[4300];
            if (!realpath(nxt, real)) snprintf(real, sizeof real, "%s", nxt);
            if (!last && !is_dir(real)) view_fail("%s %s: %s is not a folder", what, path, real);
            snprintf(cur, sizeof cur, "%s", real);
            continue;
        }
        struct stat cs;
        if (stat(cur, &cs) || !is_ours(cs.st_dev)) explode(cur, what);
        if (last && !folder) {
            int fd = open(nxt, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (fd < 0) view_fail("cannot build the worker's view: %s: %s", nxt, strerror(errno));
            close(fd);
        } else if (mkdir(nxt, 0755)) view_fail("cannot build the worker's view: mkdir %s: %s", nxt, strerror(errno));
        snprintf(cur, sizeof cur, "%s", nxt);
    }
}

static void bind_tree(int tree, const char *path, int folder, int read_only, const char *what) {
    make_path(path, folder, what);
    if (tree < 0) view_fail("cannot mount %s at %s: %s", what, path, strerror(ENOENT));
    if (syscall(SYS_move_mount, tree, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH) ||
        (read_only && mount(NULL, path, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL)))
        view_fail("cannot mount %s at %s: %s", what, path, strerror(errno));
    close(tree);
}

/* a host folder on the way to `path` that the worker may not search is covered by an empty tmpfs */
static void reach(const char *path) {
    char cur[4300] = "";
    const char *s = path;
    for (;;) {
        while (*s == '/') s++;
        size_t n = strcspn(s, "/");
        if (!n || !s[n]) return; /* the last component is not checked */
        size_t l = strlen(cur);
        snprintf(cur + l, sizeof cur - l, "/%.*s", (int)n, s);
        s += n;
        struct stat st;
        if (stat(cur, &st)) return;
        if (!S_ISDIR(st.st_mode) || is_ours(st.st_dev)) continue;
        if ((int)st.st_uid != uid && !(st.st_mode & 01)) {
            tmpfs(cur, 0755, 0, 0);
            return;
        }
    }
}

static void build_view(void) {
    int work = is_dir(cwd) ? open_tree_of(cwd) : -2;
    int sig = open_tree_of(sigdir);
    int expt[256];
    for (int i = 0; i < nexposes; i++) expt[i] = open_tree_of(exposes[i]);
    if (setns(TEMPLATE_FD, CLONE_NEWNS) || unshare(CLONE_NEWNS))
        view_fail("cannot build the worker's view: %s", strerror(errno));
    close(TEMPLATE_FD);
    if (chdir("/") || mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
        view_fail("cannot build the worker's view: mount proc on /proc: %s", strerror(errno));
    tmpfs("/tmp", 01777, 0, 0);
    tmpfs("/root", 0755, 0, 0);
    if (is_dir("/dev/shm")) tmpfs("/dev/shm", 01777, 0, 0);
    if (is_dir("/dev/mqueue") && mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
        view_fail("cannot build the worker's view: mount mqueue on /dev/mqueue: %s", strerror(errno));
    hide_again();
    char what[4400];
    for (int i = 0; i < ndrives; i++) { /* cloned by the launcher (native.py), in the host's namespace */
        snprintf(what, sizeof what, "drive at %s", drives[i].path);
        fail_prefix = what;
        bind_tree(drives[i].fd, drives[i].path, 1, drives[i].read_only, what);
    }
    hide_again(); /* a drive may hold the agent's state dir */
    for (int i = 0; i < nconfigs; i++) {
        snprintf(what, sizeof what, "config at %s", configs[i].path);
        fail_prefix = what;
        bind_tree(configs[i].fd, configs[i].path, 0, 1, what);
    }
    for (int i = 0; i < nexposes; i++) {
        snprintf(what, sizeof what, "the worker's environment %s", exposes[i]);
        fail_prefix = what;
        bind_tree(expt[i], exposes[i], 1, 1, "the worker's environment");
    }
    fail_prefix = NULL;
    reach(cwd);
    if (work != -2) bind_tree(work, cwd, 1, 0, "working folder");
    else make_path(cwd, 1, "working folder");
    bind_tree(sig, sigdir, 1, 1, "stop reason folder");
    for (int i = 0; i < nro_later; i++)
        if (mount(NULL, ro_later[i], NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL))
            view_fail("cannot build the worker's view: remount %s: %s", ro_later[i], strerror(errno));
    if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL))
        view_fail("cannot build the worker's view: remount /: %s", strerror(errno));
}

static void drop_privileges(void) {
    char buf[32];
    int last = 63;
    if (read_small("/proc/sys/kernel/cap_last_cap", buf, sizeof buf) > 0) last = atoi(buf);
    if (setgroups(0, NULL)) view_fail("cannot drop privileges: setgroups: %s", strerror(errno));
    for (int cap = 0; cap <= last; cap++) prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    if (setresgid(gid, gid, gid) || setresuid(uid, uid, uid))
        view_fail("cannot drop privileges: %s", strerror(errno));
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &hdr, data)) view_fail("cannot drop privileges: capset: %s", strerror(errno));
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) view_fail("cannot drop privileges: no_new_privs: %s", strerror(errno));
    if (getuid() == 0 || geteuid() == 0) view_fail("cannot drop privileges: still root after setresuid");
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

/* the seccomp filter the launcher gave in the plan: the Python shim's BPF program (astraeus.agent.runtime.seccomp),
 * as hex; this binary holds no table of its own. After no_new_privs; the command inherits it. */
static void install_seccomp(void) {
    if (!seccomp_hex) return; /* a machine whose system calls seccomp.py does not know: the launcher warned */
    size_t n = strlen(seccomp_hex) / 2;
    if (!n || n % sizeof(struct sock_filter) || n / sizeof(struct sock_filter) > BPF_MAXINSNS)
        view_fail("cannot install the seccomp filter: %s", strerror(EINVAL));
    unsigned char *bytes = malloc(n);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(seccomp_hex + 2 * i, "%2x", &v) != 1) view_fail("cannot install the seccomp filter: %s", strerror(EINVAL));
        bytes[i] = (unsigned char)v;
    }
    struct sock_fprog prog = {(unsigned short)(n / sizeof(struct sock_filter)), (struct sock_filter *)bytes};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0))
        view_fail("cannot install the seccomp filter: %s", strerror(errno));
    free(bytes);
}

/* shim.py's clear_identity(): /proc/self/cmdline shows `title`, /proc/self/environ nothing */
static void clear_identity(const char *title) {
    char f[4][32];
    for (int i = 0; i < 4; i++)
        if (stat_field(getpid(), 45 + i, f[i], sizeof f[i])) return;
    char *as = (char *)strtoull(f[0], NULL, 10), *ae = (char *)strtoull(f[1], NULL, 10);
    char *es = (char *)strtoull(f[2], NULL, 10), *ee = (char *)strtoull(f[3], NULL, 10);
    if (ee > es) memset(es, 0, ee - es);
    if (ae > as) {
        size_t room = ae - as, n = strlen(title);
        if (n > room - 1) n = room - 1;
        memset(as, 0, room);
        memcpy(as, title, n);
    }
}

/* the command's path as os.execvpe / shim.spawn_command find it; NULL and errno when none */
static char *find_command(void) {
    if (strchr(command, '/')) return strdup(command);
    const char *path = "/bin:/usr/bin";
    for (int i = 0; i < nenvs; i++)
        if (!strncmp(envs[i], "PATH=", 5)) path = envs[i] + 5;
    int denied = 0;
    const char *s = path;
    for (;;) {
        size_t n = strcspn(s, ":");
        char p[8300];
        if (n) snprintf(p, sizeof p, "%.*s/%s", (int)n, s, command);
        else snprintf(p, sizeof p, "%s", command);
        struct stat st;
        if (!stat(p, &st) && S_ISREG(st.st_mode)) {
            if (!access(p, X_OK)) return strdup(p);
            denied = 1;
        }
        if (!s[n]) break;
        s += n + 1;
    }
    errno = denied ? EACCES : ENOENT;
    return NULL;
}

/* the worker's PID 1: the view, the user, the command; then it reaps (shim.py's REAPER). Never returns. */
static void pid1(int go_r, int status_w, int ack_r, int out_w, int err_w) {
    char c;
    if (read(go_r, &c, 1) != 1) _exit(0); /* the shim put us in the cgroup (or is gone) */
    close(go_r);
    if (netns_path) { /* its own network (astraeus.agent.network), as mounts.enter_network */
        int nfd = open(netns_path, O_RDONLY | O_CLOEXEC);
        if (nfd < 0 || setns(nfd, CLONE_NEWNET))
            view_fail("cannot enter the worker's network namespace %s: %s", netns_path, strerror(errno));
        close(nfd);
    }
    if (unshare(CLONE_NEWIPC)) /* before the view: its /dev/mqueue is this namespace's */
        view_fail("cannot create an IPC namespace (unshare CLONE_NEWIPC): %s", strerror(errno));
    build_view();
    drop_privileges();
    install_seccomp();
    if (chdir(cwd)) {
        dprintf(res_fd, "%s: %s", command, strerror(errno));
        _exit(127);
    }
    char *path = find_command();
    if (!path) {
        dprintf(res_fd, "%s: %s", command, strerror(errno));
        _exit(127);
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out_w, 1);
    posix_spawn_file_actions_adddup2(&fa, err_w, 2);
    posix_spawn_file_actions_addclose(&fa, out_w);
    posix_spawn_file_actions_addclose(&fa, err_w);
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t none, def;
    sigemptyset(&none);
    sigemptyset(&def);
    int defs[] = {SIGPIPE, SIGXFSZ, SIGINT, SIGTERM, SIGUSR1, SIGCHLD, SIGHUP};
    for (size_t i = 0; i < sizeof defs / sizeof *defs; i++) sigaddset(&def, defs[i]);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &def);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    args[nargs] = NULL;
    envs[nenvs] = NULL;
    pid_t cmd;
    int e = posix_spawn(&cmd, path, &fa, &at, args, envs);
    if (e) {
        dprintf(res_fd, "%s: %s", command, strerror(e));
        _exit(127);
    }
    /* PID 1 from here: only its two pipes open, no environment, named astraeus-reaper; the start's pipe closed
     * last, so that the shim (which waits for its end before it says the worker started) finds PID 1 so */
    for (int fd = 3; fd < 1024; fd++)
        if (fd != ack_r && fd != status_w && fd != res_fd) close(fd);
    clear_identity("astraeus-reaper");
    close(res_fd);
    if (read(ack_r, &c, 1) < 0) {}
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p == cmd) {
            int left = 0;
            DIR *d = opendir("/proc");
            struct dirent *de;
            while (d && (de = readdir(d)))
                if (de->d_name[0] >= '0' && de->d_name[0] <= '9' && strcmp(de->d_name, "1")) left++;
            if (d) closedir(d);
            dprintf(status_w, "%d %d\n", st, left);
        }
    }
    _exit(0);
}

/* ------------------------------------------------------------------ the tree */
static void add_once(pid_t k, pid_t *out, int *n, int max) {
    for (int i = 0; i < *n; i++)
        if (out[i] == k) return;
    if (*n < max) out[(*n)++] = k;
}

/* p's children: from /proc/PID/task/TID/children where the kernel has it, else from every process's parent
 * (shim.py's children_by_scan) */
static void children_of(pid_t p, pid_t *out, int *n, int max) {
    static int have_children_file = -1;
    if (have_children_file < 0) {
        char self[64];
        snprintf(self, sizeof self, "/proc/%d/task/%d/children", getpid(), getpid());
        have_children_file = access(self, F_OK) == 0;
    }
    if (!have_children_file) {
        DIR *all = opendir("/proc");
        struct dirent *e;
        char parent[32];
        while (all && (e = readdir(all)))
            if (e->d_name[0] >= '1' && e->d_name[0] <= '9' && !stat_field(atoi(e->d_name), 1, parent, sizeof parent)
                && atoi(parent) == p)
                add_once(atoi(e->d_name), out, n, max);
        if (all) closedir(all);
        return;
    }
    char tp[64];
    snprintf(tp, sizeof tp, "/proc/%d/task", p);
    DIR *d = opendir(tp);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        char cp[320], buf[65536];
        snprintf(cp, sizeof cp, "/proc/%d/task/%s/children", p, de->d_name);
        if (read_small(cp, buf, sizeof buf) <= 0) continue;
        char *save = NULL;
        for (char *s = strtok_r(buf, " \n", &save); s && *n < max; s = strtok_r(NULL, " \n", &save))
            add_once(atoi(s), out, n, max);
    }
    if (d) closedir(d);
}

/* the live (not zombie) descendants of root */
static int descendants_of(pid_t root, pid_t *out, int max) {
    static pid_t all[8192];
    int n = 0, done = 0, k = 0;
    children_of(root, all, &n, 8192);
    while (done < n) children_of(all[done++], all, &n, 8192);
    for (int i = 0; i < n && k < max; i++)
        if (live(all[i])) out[k++] = all[i];
    return k;
}

/* our live (not zombie) descendants */
static int descendants(pid_t *out, int max) { return descendants_of(getpid(), out, max); }

static int marked(pid_t *out, int max) {
    if (!marker) return 0;
    char want[512];
    int wl = snprintf(want, sizeof want, "ASTRAEUS_WORKER_ID=%s", marker), n = 0;
    DIR *d = opendir("/proc");
    struct dirent *de;
    static char buf[1 << 17];
    while (d && (de = readdir(d)) && n < max) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9' || atoi(de->d_name) == getpid()) continue;
        char p[300];
        snprintf(p, sizeof p, "/proc/%s/environ", de->d_name);
        ssize_t len = read_small(p, buf, sizeof buf);
        for (ssize_t i = 0; i < len; i += strlen(buf + i) + 1)
            if ((ssize_t)strlen(buf + i) == wl && !memcmp(buf + i, want, wl)) {
                out[n++] = atoi(de->d_name);
                break;
            }
    }
    if (d) closedir(d);
    return n;
}

static void read_status(void) {
    if (status_r < 0) return;
    char buf[256];
    ssize_t n = read(status_r, buf, sizeof buf - 1);
    if (n < 0) return;
    if (n == 0) {
        close(status_r);
        status_r = -1;
        return;
    }
    buf[n] = 0;
    char *sp = strchr(buf, ' ');
    if (!have_status) {
        status = atoi(buf);
        have_status = 1;
        finished_at = now();
    }
    if (sp && atoi(sp + 1) == 0) /* nothing left: PID 1 exits at once */
        for (int i = 0; i < 200; i++) {
            pid_t r = waitpid(init_pid, NULL, WNOHANG);
            if (r != 0) break;
            usleep(5000);
        }
}

static void reap(void) {
    if (!have_status) read_status();
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p <= 0) return;
        if (p == init_pid) {
            read_status();
            if (!have_status) {
                status = st;
                have_status = 1;
                finished_at = now();
            }
        }
    }
}

static int tree_alive(void) {
    if (!have_status) return 1;
    pid_t p[4];
    return cg_pids(p, 4) || descendants(p, 4);
}

static void kill_tree(void) {
    static pid_t pids[8192];
    for (int attempt = 0; attempt < 20; attempt++) {
        cg_kill();
        if (pid) killpg(pid, SIGKILL);
        int n = descendants(pids, 4096);
        n += cg_pids(pids + n, 2048);
        if (attempt == 0) n += marked(pids + n, 2048);
        for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
        reap();
        usleep(20000);
        reap();
        pid_t p[4];
        if (!cg_pids(p, 4) && !descendants(p, 4) && have_status) return;
    }
}

/* ------------------------------------------------------------------ stop */
static void write_stop_reason(const char *reason_json, size_t reason_len, double grace, double requested_at) {
    char tmp[4300], final[4300];
    snprintf(tmp, sizeof tmp, "%s/.stop-reason.tmp", sigdir);
    snprintf(final, sizeof final, "%s/stop-reason", sigdir);
    makedirs(sigdir, 0777);
    buf_t b = {0};
    puts_(&b, "{\"reason\": ");
    put(&b, reason_json, reason_len);
    puts_(&b, ", \"grace_seconds\": ");
    put_float(&b, round_to(grace, 1000));
    puts_(&b, ", \"requested_at\": ");
    put_float(&b, requested_at);
    puts_(&b, "}\n");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write_all(fd, b.s, b.n) || fchown(fd, 0, gid) || fchmod(fd, 0440) || rename(tmp, final))
        slog("cannot write the stop reason: %s", strerror(errno));
    if (fd >= 0) close(fd);
    free(b.s);
}

static void check_stop(double t) {
    if (stop_requested) return;
    char p[4300], req[65536];
    path_of(p, sizeof p, "stop.json");
    int have_req = read_small(p, req, sizeof req) > 0 && *skip_ws(req) == '{';
    if (!have_req && !sigterm) return;
    double grace = stop_grace, requested_at = t;
    if (have_req) {
        grace = 30;
        number_member(req, "grace", &grace);
        number_member(req, "requested_at", &requested_at);
    }
    stop_requested = 1;
    deadline = requested_at + grace;
    slog("stop requested, grace until %.3f (in %.1fs)", deadline, deadline - t);
    if (!have_status && pid) {
        size_t rl = 0;
        const char *r = have_req ? member(req, "reason", &rl) : NULL;
        buf_t dflt = {0};
        if (!r || rl < 3 || *r != '"') { /* null, missing or "": the default */
            const char *d = sigterm ? "the worker's supervisor was asked to stop it" : "stopped";
            put_text(&dflt, (const unsigned char *)d, strlen(d));
            r = dflt.s;
            rl = dflt.n;
        }
        write_stop_reason(r, rl, deadline - t > 0 ? deadline - t : 0, requested_at);
        free(dflt.s);
        kill(pid, SIGTERM);
    }
}

/* the plan's signal, once its time has come, to a worker still running and not being stopped (the Python shim's
 * check_signal) */
static void check_signal(double t) {
    if (!signal_at || t < signal_at || have_status || !pid) return;
    signal_at = 0;
    if (stop_requested) return;
    static pid_t pids[4096];
    /* the worker's own tree: not our other children (the output readers would die of the signal); the main process
     * first, then its descendants, all at once as Slurm does (the Python shim's targets, in its order) */
    pids[0] = pid;
    int n = 1;
    if (!signal_batch_only) {
        static pid_t tree[4095];
        int k = descendants_of(pid, tree, 4095);
        for (int i = 0; i < k; i++)
            if (tree[i] != init_pid) pids[n++] = tree[i];
    }
    buf_t list = {0};
    for (int i = 0; i < n; i++) putf(&list, i ? " %d" : "%d", pids[i]);
    slog("sending signal %d to %s (pids %s) before its time limit", signal_signo,
         signal_batch_only ? "its main process" : "the worker", list.s);
    free(list.s);
    for (int i = 0; i < n; i++) kill(pids[i], signal_signo);
}

/* ------------------------------------------------------------------ wiped folder */
static void ensure_files(void) {
    struct stat st;
    if (exists(spec_path) && !fstat(log_fd, &st) && st.st_nlink > 0) return;
    slog("worker folder or log file vanished; writing them again");
    makedirs(dir, 0777);
    write_file("spec.json", spec_text ? spec_text : "{}");
    write_shim_json();
    if (started_json) write_file("started.json", started_json);
    char p[4300];
    path_of(p, sizeof p, "log.jsonl");
    if (!exists(p) || fstat(log_fd, &st) || st.st_nlink == 0) open_log();
}

/* ------------------------------------------------------------------ main */
static void finish(void) {
    char ec[32] = "null", sg[32] = "null";
    int sig = 0;
    if (have_status) {
        if (WIFSIGNALED(status)) snprintf(sg, sizeof sg, "%d", sig = WTERMSIG(status));
        else snprintf(ec, sizeof ec, "%d", WEXITSTATUS(status));
    }
    int oom = sig == SIGKILL && !killed && ncg && oom_kills() > 0;
    buf_t b = {0};
    const char *msg = NULL;
    if (oom) msg = oom_message;
    else if (killed) msg = "killed (SIGKILL) when the stop grace ran out";
    else if (leftovers_killed) msg = "processes left behind by the main process were killed";
    cleanup_cgroup();
    putf(&b, "{\"exit_code\": %s, \"signal\": %s, \"killed\": %s, \"finished_at\": ", ec, sg,
         killed ? "true" : "false");
    put_float(&b, have_status ? finished_at : now());
    putf(&b, ", \"stop_requested\": %s, \"message\": ", stop_requested ? "true" : "false");
    if (msg) put_text(&b, (const unsigned char *)msg, strlen(msg));
    else puts_(&b, "null");
    putf(&b, ", \"oom\": %s, \"oom_limit_bytes\": %s}", oom ? "true" : "false", oom ? oom_limit : "null");
    write_file("exit.json", b.s);
    slog("worker exited: exit_code=%s signal=%s killed=%s", have_status && !sig ? ec : "None", sig ? sg : "None",
         killed ? "True" : "False");
}

static pid_t find_main(pid_t init) {
    for (int tries = 0; tries < 200; tries++) {
        pid_t kids[64];
        int n = 0;
        children_of(init, kids, &n, 64);
        for (int i = 0; i < n; i++) {
            char sp[64], st[8192];
            snprintf(sp, sizeof sp, "/proc/%d/status", kids[i]);
            if (read_small(sp, st, sizeof st) <= 0) continue;
            char *l = strstr(st, "\nNSpid:");
            if (!l) continue;
            char *e = strchr(l + 1, '\n');
            if (e) *e = 0;
            char *last = strrchr(l, '\t');
            if (last && atoi(last + 1) == 2) return kids[i];
        }
        usleep(5000);
    }
    kill(init, SIGKILL);
    fail("cannot find the worker's main process in its PID namespace");
    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    read_plan();
    if (!dir) {
        slog("the plan on descriptor %d names no worker folder", PLAN_FD);
        return 2;
    }
    snprintf(spec_path, sizeof spec_path, "%s/spec.json", dir);
    snprintf(sigdir, sizeof sigdir, "%s/signal", dir);
    snprintf(state_dir, sizeof state_dir, "%s", dir);
    for (int k = 0; k < 3; k++) {
        char *s = strrchr(state_dir, '/');
        if (s) *s = 0;
    }
    if (!cwd || !command || uid <= 0 || gid <= 0 || !nargs) /* the agent hears it at once, not at its timeout */
        fail("the worker's supervisor got an incomplete plan from the shim launcher");
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGUSR1);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) slog("no child subreaper: %s", strerror(errno));
    shim_ctime = create_time(getpid());
    write_shim_json();
    open_log();
    for (int i = 0; i < nwarns; i++) slog("%s", warns[i]);

    int outp[2], errp[2], gop[2], resp[2], stp[2], ackp[2];
    if (pipe(outp) || pipe(errp) || pipe(gop) || pipe2(resp, O_CLOEXEC) || pipe2(stp, O_CLOEXEC) ||
        pipe2(ackp, O_CLOEXEC))
        fail("cannot start the command: no pipes");
    if (unshare(CLONE_NEWPID)) {
        char m[256];
        snprintf(m, sizeof m, "cannot create a PID namespace (unshare CLONE_NEWPID): %s", strerror(errno));
        fail(m);
    }
    pid_t init = fork();
    if (init < 0) fail("cannot start the command: fork failed");
    if (init == 0) {
        close(outp[0]), close(errp[0]), close(gop[1]), close(resp[0]), close(stp[0]), close(ackp[1]), close(sfd);
        if (log_fd >= 0) close(log_fd);
        signal(SIGPIPE, SIG_DFL), signal(SIGXFSZ, SIG_DFL), signal(SIGINT, SIG_DFL), signal(SIGHUP, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        res_fd = resp[1];
        pid1(gop[0], stp[1], ackp[0], outp[1], errp[1]);
    }
    close(TEMPLATE_FD);
    for (int i = 0; i < ndrives; i++) close(drives[i].fd);
    for (int i = 0; i < nconfigs; i++) close(configs[i].fd);
    close(stp[1]), close(ackp[0]), close(outp[1]), close(errp[1]), close(gop[0]), close(resp[1]);
    status_r = stp[0];
    fcntl(status_r, F_SETFL, O_NONBLOCK);
    init_pid = init;
    char ps[32];
    snprintf(ps, sizeof ps, "%d", init);
    for (int i = 0; i < ncg;) { /* joined here, by root, while the child waits */
        if (cg_write(cgdirs[i], "cgroup.procs", ps)) {
            slog("cannot move pid %d into %s: %s; tracking the worker without it", init, cgdirs[i], strerror(errno));
            rmdir(cgdirs[i]);
            cg_drop(i);
        } else i++;
    }
    if (write(gop[1], "x", 1) < 0) {}
    close(gop[1]);
    char err[4200];
    size_t el = 0;
    ssize_t r;
    while ((r = read(resp[0], err + el, sizeof err - 1 - el)) != 0) {
        if (r < 0) {
            if (errno == EINTR) continue;
            break;
        }
        el += r;
        if (el >= sizeof err - 1) break;
    }
    err[el] = 0;
    close(resp[0]);
    if (el) {
        close(ackp[1]);
        waitpid(init, NULL, 0);
        if (!strncmp(err, "FAIL:", 5)) fail(err + 5);
        char m[4400];
        snprintf(m, sizeof m, "cannot start the command: %s", err);
        fail(m);
    }
    pid = find_main(init);
    if (write(ackp[1], "x", 1) < 0) {}
    close(ackp[1]);

    pid_ctime = create_time(pid);
    buf_t sj = {0};
    putf(&sj, "{\"pid\": %d, \"pid_create_time\": ", pid);
    put_float(&sj, pid_ctime);
    putf(&sj, ", \"pgid\": %d, \"shim_pid\": %d, \"shim_create_time\": ", pid, getpid());
    put_float(&sj, shim_ctime);
    puts_(&sj, ", \"started_at\": ");
    put_float(&sj, now());
    putf(&sj, ", \"cgroup\": %s, \"cgroups\": %s, \"limits\": %s}", ncg ? cgroup_json : "null",
         ncg ? cgroups_json : "null", limits_json);
    started_json = sj.s;
    write_file("started.json", started_json);
    if (signal_signo > 0) signal_at = now() + signal_after;
    {
        buf_t a = {0};
        for (int i = 1; i < nargs; i++) {
            puts_(&a, i > 1 ? ", '" : "'");
            puts_(&a, args[i]);
            puts_(&a, "'");
        }
        slog("started pid %d: %s [%s]", pid, command, a.s ? a.s : "");
        free(a.s);
    }

    struct pollfd pf[4] = {{outp[0], POLLIN, 0}, {errp[0], POLLIN, 0}, {status_r, POLLIN, 0}, {sfd, POLLIN, 0}};
    fcntl(outp[0], F_SETFL, O_NONBLOCK);
    fcntl(errp[0], F_SETFL, O_NONBLOCK);
    int open_streams = 2;
    double last_files_check = 0, drain_until = 0;
    static char chunk[65536];
    for (;;) {
        double t = now();
        int timeout = 250;
        if (deadline && !have_status) {
            double left = deadline - t;
            if (left < 0) left = 0;
            if (left * 1000 < timeout) timeout = (int)(left * 1000);
        }
        if (signal_at) {
            double left = signal_at - t;
            if (left < 0) left = 0;
            if (left * 1000 < timeout) timeout = (int)(left * 1000);
        }
        pf[2].fd = status_r;
        if (poll(pf, 4, timeout) < 0 && errno != EINTR) break;
        for (int i = 0; i < 2; i++) {
            if (pf[i].fd < 0 || !pf[i].revents) continue;
            ssize_t n = read(pf[i].fd, chunk, sizeof chunk);
            if (n > 0) feed(i, chunk, n, now());
            else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                close(pf[i].fd);
                pf[i].fd = -1;
                open_streams--;
                flush_partials(now(), 1);
            }
        }
        if (pf[3].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == sizeof si)
                if (si.ssi_signo == SIGTERM) sigterm = 1;
        }
        t = now();
        reap();
        check_stop(t);
        check_signal(t);
        flush_partials(t, 0);
        if (t - last_files_check >= 0.5) {
            last_files_check = t;
            ensure_files();
        }
        if (drain_until) {
            if (!open_streams || t >= drain_until) break;
            continue;
        }
        if (!have_status) {
            if (deadline && t >= deadline) {
                slog("stop grace ran out: SIGKILL to the whole tree");
                killed = 1;
                kill_tree();
            }
            continue;
        }
        if (tree_alive()) {
            if (!stop_requested || (deadline && t >= deadline)) {
                if (stop_requested) {
                    slog("stop grace ran out: SIGKILL to what the main process left behind");
                    killed = 1;
                } else slog("main process ended; killing what it left behind");
                leftovers_killed = 1;
                kill_tree();
            } else continue;
        }
        drain_until = t + 1.0;
        if (!open_streams) break;
    }
    flush_partials(now(), 1);
    finish();
    return 0;
}
