def summarize_orders(orders, currency="EUR"):
    """Return the total, the largest order and the number of orders in `currency`."""
    total = 0
    largest = None
    count = 0
    for order in orders:
        if order.currency != currency:
            continue
        total += order.amount
        count += 1
        if largest is None or order.amount > largest.amount:
            largest = order
    return total, largest, count


# The same function after renaming `orders` to `invoices` and `order` to `invoice`:

def summarize_invoices(invoices, currency="EUR"):
    """Return the total, the largest invoice and the number of invoices in `currency`."""
    total = 0
    largest = None
    count = 0
    for invoice in invoices:
