/* dropless info --layout [--json]: the one table of the layer's arrays
 * (DL_VALUE_MAP) as the golden format lays it out, for people and for the
 * Python side, which reads this output instead of keeping a copy. */
#include "config.h"
#include <stdio.h>
#include <string.h>
#include "dropless.h"
#include "cli.h"

static const char *const store_names[] = {"act", "f32", "i32", "i64", "rt"};
static const char *const group_names[] = {"inputs", "forward", "backward"};

/* The library writes the JSON (dl_api_layout_json), so the bindings and
 * this command print the same text. */
static int print_json(void)
{
    char *s = dl_api_layout_json();
    if (!s)
        return DL_ENOMEM;
    fputs(s, stdout);
    dl_api_free_text(s);
    return 0;
}

static void print_table(void)
{
    printf("%-9s %-16s %-5s %-5s %-7s %s\n", "group", "name", "store", "dims", "cond", "value");
    for (int i = 0; i < dl_layout_count(); i++) {
        const dl_layout_row_t *r = dl_layout_row(i);
        printf("%-9s %-16s %-5s %-5s %-7s ", group_names[r->group], r->name, store_names[r->store],
               r->dims, dl_cond_name(r->cond));
        if (r->value == DL_VALUE_NONE)
            printf("-\n");
        else
            printf("%d\n", (int)r->value);
    }
    printf("dims: T tokens, d hidden, f ffn, E experts, k top_k, M = T*k, P = E+1, "
           "R = E + zero_experts (the router's width); "
           "store act = the case's dtype, rt = its router_dtype\n");
}

int dl_cli_layout(int argc, char **argv)
{
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (strcmp(argv[i], "--layout")) {
            fprintf(stderr, "dropless info --layout: unexpected argument '%s' (only --json)\n",
                    argv[i]);
            return DL_EXIT_USAGE;
        }
    }
    if (json) {
        if (print_json()) {
            fprintf(stderr, "dropless info --layout: out of memory\n");
            return DL_EXIT_FAIL;
        }
    } else {
        print_table();
    }
    return DL_EXIT_OK; /* stdout's errors are main's to report, once */
}
