/*
 * ep_dl.c - the run-time loader of expert parallelism's communication libraries (ep_dl.h):
 * an already loaded copy first (RTLD_NOLOAD), else a fresh load, with every dlerror() kept
 * for the caller's message; a transport's table filled once.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1   /* dlinfo, RTLD_NOLOAD */
#endif
#include "ep_dl.h"

#include <dlfcn.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends "; " (after the first) and text to why[len]; truncates silently. */
static void append(char *why, size_t len, const char *text) {
    const size_t used = strlen(why);
    if (used + 1 >= len) return;
    snprintf(why + used, len - used, "%s%s", used ? "; " : "", text);
}

void *moex_ep_dlopen(const char *env_var, const char *soname, const char *path, const char *what, const char **name,
                     char *why, size_t why_len) {
    const char *env = getenv(env_var);
    const bool by_env = env && env[0];
    const char *names[2] = {by_env ? env : soname, by_env ? NULL : path};
    const int n = 2;
    char errors[1024] = "";
    *name = names[0];
    /* 1. a copy the process has already: the communicator's owner loaded it */
    for (int i = 0; i < n; i++) {
        if (!names[i]) continue;
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
        if (lib) return lib;
    }
    (void)dlerror();
    /* 2. a fresh load, each name in turn */
    for (int i = 0; i < n; i++) {
        if (!names[i]) continue;
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) return lib;
        const char *e = dlerror();
        append(errors, sizeof errors, e ? e : names[i]);
    }
    snprintf(why, why_len, "cannot load %s %s%s%s%s (%s)", what, names[0], by_env ? " ($" : "", by_env ? env_var : "",
             by_env ? ")" : "", errors);
    return NULL;
}

const void *moex_ep_dl_load_once(moex_ep_dl_once *once, const moex_ep_dl_lib *l, moex_ep_dl_fill fill, void *table,
                                 size_t table_bytes, char *why, size_t why_len) {
    pthread_mutex_lock(&once->lock);
    if (!once->loaded) {
        const char *name;
        void *lib = moex_ep_dlopen(l->env_var, l->soname, l->path, l->what, &name, why, why_len);
        if (lib) {
            memset(table, 0, table_bytes);
            moex_ep_resolver r = {lib, true, ""};
            if (!fill(&r, name, table, why, why_len)) {
                if (!r.ok)
                    snprintf(why, why_len, "%s %s (%s) lacks %s%s", l->what, name, moex_ep_dl_path(lib), r.why,
                             l->lacks_hint);
                moex_ep_dlclose(lib);
                lib = NULL;
            }
        }
        once->loaded = lib != NULL;
    }
    const bool loaded = once->loaded;
    pthread_mutex_unlock(&once->lock);
    return loaded ? table : NULL;
}

void moex_ep_dlclose(void *lib) {
    if (lib) (void)dlclose(lib);
}

void *moex_ep_dlsym(void *lib, const char *name, char *why, size_t why_len) {
    (void)dlerror();
    void *sym = dlsym(lib, name);
    if (sym) return sym;
    const char *e = dlerror();
    if (why && why_len) snprintf(why, why_len, "%s: %s", name, e ? e : "not found");
    return NULL;
}

const char *moex_ep_dl_path(void *lib) {
    struct link_map *map = NULL;
    if (lib && dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0]) return map->l_name;
    return "?";
}
